// Cross-process wake-ups. Each rank of a communicator on this host owns an abstract-namespace
// Unix datagram socket; a peer that makes progress possible for a sleeping rank sends it one
// byte. Because it is a descriptor, one poll() waits on shared memory, TCP sockets and peer
// liveness together. Senders ring only when the target has raised its `sleeping` flag, so
// the common spinning case costs no system call.
#pragma once
#include <sys/socket.h>
#include <sys/un.h>
#include <string>
#include <vector>

namespace ringtree {

class Doorbell {
 public:
  Doorbell() = default;
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // name_prefix identifies the communicator; each rank binds prefix + its rank.
  void open(const std::string& name_prefix, int rank, int nranks);
  void ring(int peer);
  void drain();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::vector<sockaddr_un> peers_;
  std::vector<socklen_t> peer_len_;
};

}  // namespace ringtree
