// Cross-process wake-ups. Each rank of a communicator on this host owns a Unix datagram socket;
// a peer that makes progress possible for a sleeping rank sends it one byte. Because it is a
// descriptor, one poll() waits on shared memory, TCP sockets and peer liveness together. Senders
// ring only when the target has raised its `sleeping` flag, so the common spinning case costs
// no system call.
//
// Nobody else can ring: a rank's socket has a name only during set-up, inside a directory that
// the rank creates (it must not exist yet; a name that does is routed around) with mode 0700,
// under a random name of the rank's own, which its peers learn over the authenticated set-up;
// every shared-memory peer connects a sender of its own to it then, and the name and
// its directory are removed. Afterwards no path leads to the socket (/proc/net/unix still shows
// the one it was bound to, which is gone) and only the connected senders reach it. Set-up takes
// three steps, between barriers the executor makes anyway: bind, connect, forget the name.
#pragma once
#include <string>
#include <vector>

namespace ringtree {

struct Mesh;

class Doorbell {
 public:
  Doorbell() = default;
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // Names this rank's socket (ranks with shared-memory peers only); returns the random part of
  // its name, for the peers.
  std::string bind();
  // Once every rank has bound its socket: a sender to each shared-memory peer's; names[q] is
  // the random part rank q's bind() returned.
  void connect(const Mesh& mesh, int rank, const std::vector<std::string>& names);
  // Once every peer has connected: nothing can reach the socket but those senders.
  void forget_name();
  void ring(int peer);
  void drain();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::vector<int> senders_;  // per peer: connected to its socket; -1 where it shares no memory
  std::string dir_;           // while the socket has a name
};

}  // namespace ringtree
