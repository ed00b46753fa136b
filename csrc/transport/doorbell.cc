#include "transport/doorbell.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include "bootstrap/bootstrap.h"
#include "common/check.h"

namespace ringtree {

namespace {

// Where the names live for the moment of set-up: the shared-memory transport needs its peers
// to share /dev/shm anyway (transport/shm/shm.h, shared_memory_domain).
constexpr char kDirTemplate[] = "/dev/shm/ringtree-bell-XXXXXX";

sockaddr_un unix_address(const char* path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path, sizeof(a.sun_path) - 1);
  return a;
}

int datagram_socket() {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  RT_SYSCHECK(fd, "doorbell socket");
  return fd;
}

}  // namespace

Doorbell::~Doorbell() {
  remove_name();
  for (int fd : senders_)
    if (fd >= 0) ::close(fd);
  if (fd_ >= 0) ::close(fd_);
}

void Doorbell::remove_name() {
  if (dir_.empty()) return;
  ::unlink((dir_ + "/bell").c_str());
  ::rmdir(dir_.c_str());
  dir_.clear();
}

void Doorbell::open(Bootstrap& boot, const Mesh& mesh, int rank) {
  const int size = static_cast<int>(mesh.peers.size());
  bool local_peers = false;
  for (int q = 0; q < size; ++q) local_peers |= q != rank && !mesh.pair_uses_tcp(rank, q);
  char name[sizeof(sockaddr_un::sun_path)] = {};
  if (local_peers) {
    fd_ = datagram_socket();
    char dir[sizeof(kDirTemplate)];
    std::memcpy(dir, kDirTemplate, sizeof(dir));
    if (!mkdtemp(dir)) throw_system_error(str_cat("doorbell: mkdtemp ", kDirTemplate), errno);
    dir_ = dir;
    const std::string path = dir_ + "/bell";
    const sockaddr_un self = unix_address(path.c_str());
    if (bind(fd_, reinterpret_cast<const sockaddr*>(&self), sizeof(self)) < 0)
      throw_system_error("doorbell bind " + path, errno);
    std::strncpy(name, path.c_str(), sizeof(name) - 1);
  }
  std::vector<char> names(sizeof(name) * size);
  boot.all_gather(name, names.data(), sizeof(name));
  senders_.assign(size, -1);
  for (int q = 0; q < size; ++q) {
    if (q == rank || mesh.pair_uses_tcp(rank, q)) continue;
    const char* peer = names.data() + q * sizeof(name);
    senders_[q] = datagram_socket();
    const sockaddr_un a = unix_address(peer);
    if (connect(senders_[q], reinterpret_cast<const sockaddr*>(&a), sizeof(a)) < 0)
      throw_system_error(str_cat("doorbell: connecting to rank ", q, "'s socket ", peer), errno);
  }
  boot.barrier();  // every sender is connected: the names can go
  remove_name();
}

void Doorbell::ring(int peer) {
  const int fd = senders_[peer];
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
