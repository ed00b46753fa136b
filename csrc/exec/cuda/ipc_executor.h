// The CUDA IPC executor: when every rank of a communicator runs on this host, each rank's
// schedule is walked by a kernel (exec/step_walker.h, one thread block per channel) that moves
// chunks through mailboxes in the receivers' device memory, mapped into every rank through CUDA
// IPC (transport/cuda_ipc; what a peer needs to map them is exchanged over the host
// communicator). Ranks may share a GPU (several processes on one device) or not. Internal to
// device_comm.cc; plain C++ so it can be declared there.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include "ringtree/communicator.h"

namespace ringtree {

class DeviceWork;

class IpcPath {
 public:
  // Collective over `host`: every rank calls it at the same point, and every rank gets the same
  // answer: a path, or nullptr with `why` naming what some rank could not do (another host, no
  // IPC, too many ranks). Never throws for those; a failing host collective does throw.
  static std::shared_ptr<IpcPath> connect(std::shared_ptr<Communicator> host, std::string* why);
  virtual ~IpcPath() = default;
  // Whether this executor runs such a call (same answer on every rank for the same call).
  virtual bool takes(const CollectiveArgs& args) const = 0;
  // Enqueues the collective on `stream` (a cudaStream_t); validated before anything is enqueued.
  virtual std::shared_ptr<DeviceWork> run(const CollectiveArgs& args, uintptr_t stream, bool want_work) = 0;
  virtual void close() = 0;
};

}  // namespace ringtree
