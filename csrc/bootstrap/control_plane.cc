#include "bootstrap/control_plane.h"

#include <sys/socket.h>
#include <algorithm>
#include <cstring>
#include "bootstrap/socket.h"
#include "common/check.h"

namespace ringtree {

namespace {

constexpr uint32_t kCtrlMagic = 0x52544354;  // "RTCT"
constexpr uint32_t kMaxCtrlText = 4096;
constexpr uint32_t kGoodbye = 0;  // wire kinds: 0 goodbye, else 1 + ErrorKind

struct CtrlWire {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;
  uint32_t text_len;
  uint32_t pad;
};

}  // namespace

void ControlPlane::attach(int rank, Mesh& mesh) {
  rank_ = rank;
  peers_ = mesh.peers;
  fd_ = mesh.ctrl_fd;
  for (int& fd : mesh.ctrl_fd) fd = -1;  // owned here now
  state_.assign(fd_.size(), PeerState::Alive);
  for (size_t q = 0; q < fd_.size(); ++q)
    if (fd_[q] >= 0) set_nonblocking(fd_[q]);
}

std::string ControlPlane::who(int q) const {
  return str_cat("rank ", q, " (pid ", peers_[q].pid, " on ", peers_[q].host, ")");
}

void ControlPlane::broadcast_abort(ErrorKind kind, uint64_t seq, const std::string& text) {
  std::string msg(sizeof(CtrlWire), '\0');
  CtrlWire w{kCtrlMagic, 1 + static_cast<uint32_t>(kind), seq,
             static_cast<uint32_t>(std::min<size_t>(text.size(), kMaxCtrlText)), 0};
  std::memcpy(msg.data(), &w, sizeof(w));
  msg.append(text, 0, w.text_len);
  std::lock_guard<std::mutex> lock(fd_mu_);
  for (size_t q = 0; q < fd_.size(); ++q)
    if (static_cast<int>(q) != rank_ && fd_[q] >= 0)
      (void)send(fd_[q], msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void ControlPlane::goodbye_and_close() {
  const CtrlWire w{kCtrlMagic, kGoodbye, 0, 0, 0};
  std::lock_guard<std::mutex> lock(fd_mu_);
  for (size_t q = 0; q < fd_.size(); ++q) {
    if (fd_[q] < 0) continue;
    (void)send(fd_[q], &w, sizeof(w), MSG_DONTWAIT | MSG_NOSIGNAL);
    close_fd(fd_[q]);
  }
}

void ControlPlane::add_pollfds(std::vector<pollfd>& fds, std::vector<int>& pollfd_peer) const {
  for (size_t q = 0; q < fd_.size(); ++q) {
    if (static_cast<int>(q) == rank_ || fd_[q] < 0) continue;
    fds.push_back({fd_[q], POLLIN, 0});
    pollfd_peer.push_back(static_cast<int>(q));
  }
}

void ControlPlane::raise_notice_if_any() {
  if (!notice_) return;
  std::exception_ptr notice = notice_;
  notice_ = nullptr;
  notice_raised_ = true;
  std::rethrow_exception(notice);
}

void ControlPlane::raise_pending_notice() {
  raise_notice_if_any();  // already read (with the data that woke this rank): it explains too
  const Deadline grace = Deadline::after_seconds(0.2);  // the notice is sent before the close
  for (;;) {
    for (size_t q = 0; q < fd_.size(); ++q) {
      if (static_cast<int>(q) == rank_ || fd_[q] < 0) continue;
      CtrlWire w{};
      const ssize_t n = recv(fd_[q], &w, sizeof(w), MSG_DONTWAIT | MSG_PEEK);
      if (n == static_cast<ssize_t>(sizeof(w)) && w.magic == kCtrlMagic && w.kind != kGoodbye) {
        handle(static_cast<int>(q));
        raise_notice_if_any();
      }
    }
    if (grace.expired()) return;
    poll(nullptr, 0, 10);
  }
}

void ControlPlane::handle(int q) {
  int& fd = fd_[q];
  CtrlWire w{};
  ssize_t n = recv(fd, &w, sizeof(w), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  const bool eof = n <= 0;
  if (!eof && static_cast<size_t>(n) < sizeof(w)) {
    try {
      read_full(fd, reinterpret_cast<uint8_t*>(&w) + n, sizeof(w) - static_cast<size_t>(n),
                Deadline::after_seconds(1.0));
    } catch (const Error&) {
      n = 0;
    }
  }
  if (eof || n == 0 || w.magic != kCtrlMagic) {
    {
      std::lock_guard<std::mutex> lock(fd_mu_);
      close_fd(fd);
    }
    if (state_[q] == PeerState::Departed) return;
    state_[q] = PeerState::Gone;
    notice_raised_ = false;
    RT_THROW(PeerFailure, who(q), " died or lost its connection");
  }
  if (w.kind == kGoodbye) {  // it closed its communicator normally
    state_[q] = PeerState::Departed;
    std::lock_guard<std::mutex> lock(fd_mu_);
    close_fd(fd);
    return;
  }
  std::string text(std::min(w.text_len, kMaxCtrlText), '\0');
  try {
    read_full(fd, text.data(), text.size(), Deadline::after_seconds(1.0));
  } catch (const Error&) {
  }
  if (notice_) return;  // the first notice explains; later ones repeat it
  // A peer's timeout, dead peer, mismatch or abort is this rank's too; anything else is a plain
  // Error here.
  const uint32_t code = w.kind - 1;
  ErrorKind kind = code < static_cast<uint32_t>(ErrorKind::Count) ? static_cast<ErrorKind>(code) : ErrorKind::Error;
  if (kind != ErrorKind::Timeout && kind != ErrorKind::PeerFailure && kind != ErrorKind::CollectiveMismatch &&
      kind != ErrorKind::Aborted)
    kind = ErrorKind::Error;
  notice_ = make_error(kind, str_cat("rank ", q, " aborted the communicator: ", text));
}

}  // namespace ringtree
