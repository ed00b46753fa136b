#include "transport/doorbell.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include "bootstrap/bootstrap.h"
#include "common/check.h"
#include "transport/shm/shm.h"

namespace ringtree {

namespace {

// Where the names live for the moment of set-up: the shared-memory transport needs its peers
// to share /dev/shm anyway (transport/shm/shm.h, shared_memory_domain). The part after the
// prefix is the owner's own random draw (shm.h, random_name_part).
std::string bell_dir(const std::string& random_part) { return "/dev/shm/ringtree-bell-" + random_part; }

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  RT_CHECK(path.size() < sizeof(a.sun_path), Error, "doorbell path too long: ", path);
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

int datagram_socket() {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  RT_SYSCHECK(fd, "doorbell socket");
  return fd;
}

}  // namespace

Doorbell::~Doorbell() {
  forget_name();
  for (int fd : senders_)
    if (fd >= 0) ::close(fd);
  if (fd_ >= 0) ::close(fd_);
}

std::string Doorbell::bind() {
  // Made here, now: one that exists already is someone else's, so another name is drawn.
  std::string part, dir;
  for (int attempt = 0; dir_.empty() && attempt < kFreshNameTries; ++attempt) {
    part = random_name_part(attempt);
    dir = bell_dir(part);
    if (mkdir(dir.c_str(), 0700) == 0)
      dir_ = dir;
    else if (errno != EEXIST)
      throw_system_error("doorbell: mkdir " + dir, errno);
  }
  RT_CHECK(!dir_.empty(), BootstrapError, "doorbell: ", kFreshNameTries,
           " fresh random names in /dev/shm were all taken already: another process is creating names there as "
           "fast as they are drawn");
  fd_ = datagram_socket();
  const sockaddr_un self = unix_address(dir + "/bell");
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&self), sizeof(self)) < 0)
    throw_system_error("doorbell: bind " + dir + "/bell", errno);
  return part;
}

void Doorbell::connect(const Mesh& mesh, int rank, const std::vector<std::string>& names) {
  const int size = static_cast<int>(mesh.peers.size());
  senders_.assign(size, -1);
  for (int q = 0; q < size; ++q) {
    if (q == rank || mesh.pair_uses_tcp(rank, q)) continue;
    senders_[q] = datagram_socket();
    const std::string peer = bell_dir(names[q]) + "/bell";
    const sockaddr_un a = unix_address(peer);
    if (::connect(senders_[q], reinterpret_cast<const sockaddr*>(&a), sizeof(a)) < 0)
      throw_system_error(str_cat("doorbell: connecting to rank ", q, "'s socket ", peer), errno);
  }
}

void Doorbell::forget_name() {
  if (dir_.empty()) return;
  ::unlink((dir_ + "/bell").c_str());
  ::rmdir(dir_.c_str());
  dir_.clear();
}

void Doorbell::ring(int peer) {
  const int fd = peer < static_cast<int>(senders_.size()) ? senders_[peer] : -1;
  if (fd < 0) return;
  char byte = 1;
  // EAGAIN means the peer already has wake-ups queued; anything else means it is gone, which
  // the liveness connection reports.
  (void)::send(fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void Doorbell::drain() {
  char buf[64];
  while (recv(fd_, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace ringtree
