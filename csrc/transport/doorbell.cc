#include "transport/doorbell.h"

#include <unistd.h>
#include <cerrno>
#include <cstring>
#include "common/check.h"

namespace ringtree {

namespace {

socklen_t abstract_address(const std::string& name, sockaddr_un& a) {
  std::memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  // Leading NUL: abstract namespace, nothing on the filesystem to clean up after a crash.
  const size_t n = std::min(name.size(), sizeof(a.sun_path) - 2);
  std::memcpy(a.sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

}  // namespace

Doorbell::~Doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

void Doorbell::open(const std::string& prefix, int rank, int nranks) {
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  RT_SYSCHECK(fd_, "doorbell socket");
  sockaddr_un self;
  socklen_t len = abstract_address(prefix + "." + std::to_string(rank), self);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&self), len) < 0)
    throw_system_error("doorbell bind (is the same unique id used twice?)", errno);
  peers_.resize(nranks);
  peer_len_.resize(nranks);
  for (int r = 0; r < nranks; ++r) peer_len_[r] = abstract_address(prefix + "." + std::to_string(r), peers_[r]);
}

void Doorbell::ring(int peer) {
  char byte = 1;
  // EAGAIN means the peer already has wake-ups queued; anything else means it is gone, which
  // the liveness connection reports.
  (void)sendto(fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&peers_[peer]), peer_len_[peer]);
}

void Doorbell::drain() {
  char buf[64];
  while (recv(fd_, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace ringtree
