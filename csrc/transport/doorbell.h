// Cross-process wake-ups. Each rank of a communicator on this host owns a Unix datagram socket;
// a peer that makes progress possible for a sleeping rank sends it one byte. Because it is a
// descriptor, one poll() waits on shared memory, TCP sockets and peer liveness together. Senders
// ring only when the target has raised its `sleeping` flag, so the common spinning case costs
// no system call.
//
// Nobody else can ring: a rank's socket has a name only during set-up, inside a directory only
// its user may enter (made by mkdtemp, mode 0700); every shared-memory peer connects a sender of
// its own to it then, and the name and its directory are removed. Afterwards no path leads to
// the socket (/proc/net/unix still shows the one it was bound to, which is gone), and only the
// connected senders reach it.
#pragma once
#include <string>
#include <vector>

namespace ringtree {

class Bootstrap;
struct Mesh;

class Doorbell {
 public:
  Doorbell() = default;
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // Collective over the bootstrap: every rank calls it, with or without shared-memory peers.
  void open(Bootstrap& boot, const Mesh& mesh, int rank);
  void ring(int peer);
  void drain();
  int fd() const { return fd_; }

 private:
  void remove_name();

  int fd_ = -1;
  std::vector<int> senders_;  // per peer: connected to its socket; -1 where it shares no memory
  std::string dir_;           // while the socket has a name
};

}  // namespace ringtree
