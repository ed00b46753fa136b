// The control plane: one connection per peer, made by the bootstrap, that carries what is not
// data. A rank that fails a call tells every peer why (its error kind and text), a rank that
// closes says goodbye, and a peer whose connection breaks is dead. Waiting ranks poll these
// connections next to their data, so an abort notice or a death wakes them at once.
#pragma once
#include <poll.h>
#include <exception>
#include <mutex>
#include <string>
#include <vector>
#include "bootstrap/bootstrap.h"
#include "ringtree/errors.h"

namespace ringtree {

class ControlPlane {
 public:
  enum class PeerState : uint8_t { Alive, Departed, Gone };  // Departed: said goodbye; Gone: no connection

  ControlPlane() = default;
  // Takes over the mesh's control connections (made non-blocking).
  void attach(int rank, Mesh& mesh);

  PeerState state(int peer) const { return state_[peer]; }
  bool alive(int peer) const { return state_[peer] == PeerState::Alive; }
  // "rank 2 (pid 123 on host)".
  std::string who(int peer) const;

  // Tells every peer that this rank aborted call `seq` with an error of `kind`.
  void broadcast_abort(ErrorKind kind, uint64_t seq, const std::string& text);
  // Tells every peer that this rank leaves normally, and closes the connections.
  void goodbye_and_close();

  // Appends a pollfd per open control connection (pollfd_peer gets the peer's rank).
  void add_pollfds(std::vector<pollfd>& fds, std::vector<int>& pollfd_peer) const;
  // Reads what peer q sent. Throws PeerFailure when q died; records an abort notice for later.
  void handle(int peer);

  // A peer's abort notice, raised once this rank can make no progress (or at its next call):
  // peers may run ahead, so the notice can concern a later call than one this rank can still
  // finish with data already delivered. After it is raised, notice_raised() is true until reset.
  void raise_notice_if_any();
  // Waits a moment for the notice a peer sends before it closes its data connection, and
  // raises it if it comes (its reason beats our observation of its absence).
  void raise_pending_notice();
  bool notice_raised() const { return notice_raised_; }
  void reset_notice_raised() { notice_raised_ = false; }

 private:
  int rank_ = 0;
  mutable std::mutex fd_mu_;  // abort() sends from another thread while the executor reads and closes
  std::vector<int> fd_;       // per peer, -1 for self or closed
  std::vector<PeerInfo> peers_;
  std::vector<PeerState> state_;
  std::exception_ptr notice_;
  bool notice_raised_ = false;  // the failure came from a peer, which already told everyone
};

}  // namespace ringtree
