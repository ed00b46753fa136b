// algo="nccl": the whole collective handed to NCCL (libnccl.so.2, loaded at run time by
// transport/nccl) on the caller's stream. The call is validated and lowered like every other
// (exec/plan.h): NCCL's own collectives run where it has one, the direct schedules (all_to_all,
// gather, scatter, all_to_all_v, p2p) go to it as grouped send/recv, and premul_sum and avg are
// the plan's pre- and post-steps around a sum. The NCCL communicator is made at the first call
// (its unique id travels over the host communicator); a watchdog aborts it when a call runs past
// its timeout, so a hang inside NCCL becomes an error on every rank. Plain C++ header.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include "exec/cuda/device_comm.h"

namespace ringtree {

class NcclExecutor {
 public:
  // `nccl_library_hint`: where the nvidia-nccl wheel keeps libnccl.so.2 ("" if not installed).
  static std::shared_ptr<NcclExecutor> create(std::shared_ptr<Communicator> host, std::string nccl_library_hint);
  virtual ~NcclExecutor() = default;
  virtual std::shared_ptr<DeviceWork> run(const CollectiveArgs& args, uintptr_t stream, bool want_work) = 0;
  virtual void close() = 0;
};

}  // namespace ringtree
