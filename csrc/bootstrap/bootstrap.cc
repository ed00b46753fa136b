#include "bootstrap/bootstrap.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <algorithm>
#include <cstring>
#include <deque>
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/env.h"

namespace ringtree {

namespace {

constexpr uint32_t kHelloMagic = 0x52544231;  // "RTB1"
constexpr uint32_t kTableMagic = 0x52545442;  // "RTTB"
constexpr uint32_t kMeshMagic = 0x52544d48;   // "RTMH"
// 2: peers carry their shared-memory domain; 3: message connections; 4: CPU-sharing domain
constexpr uint32_t kVersion = 4;
constexpr int kMaxRanks = 1 << 16;
constexpr uint32_t kMaxErrorText = 1024;
constexpr size_t kMaxPendingHellos = 1024;  // connections whose hello is still on its way

struct HelloWire {
  uint32_t magic, version;
  uint8_t secret[16];
  int32_t rank, size, pid;
  uint16_t mesh_port;
  uint8_t force_tcp, pad;
  char ip[16];
  char host[64];
  uint64_t shm_domain;
  uint64_t cpu_domain;
  uint32_t cpu_count, pad2;
};

struct PeerWire {
  int32_t pid;
  uint16_t mesh_port;
  uint8_t force_tcp, pad;
  char ip[16];
  char host[64];
  uint64_t shm_domain;
  uint64_t cpu_domain;
  uint32_t cpu_count, pad2;
};

struct TableHeaderWire {
  uint32_t magic;
  int32_t status;  // 0 ok, else text_len bytes of explanation follow
  int32_t size;
  uint32_t text_len;
};

struct MeshHelloWire {
  uint32_t magic;
  uint8_t secret[16];
  int32_t rank;
  int32_t channel;  // a Channel
};

enum Channel : int32_t { kControl = 0, kData = 1, kMessage = 2 };

// The connections a pair makes: control and message always, data when the pair talks TCP.
std::vector<int32_t> pair_channels(const Mesh& mesh, int a, int b) {
  if (mesh.pair_uses_tcp(a, b)) return {kControl, kData, kMessage};
  return {kControl, kMessage};
}

std::vector<int>& channel_fds(Mesh& mesh, int32_t channel) {
  return channel == kControl ? mesh.ctrl_fd : channel == kData ? mesh.data_fd : mesh.msg_fd;
}

bool secret_matches(const uint8_t* got, const std::array<uint8_t, 16>& want) {
  uint8_t diff = 0;  // constant time: no early exit on the first differing byte
  for (size_t i = 0; i < 16; ++i) diff |= static_cast<uint8_t>(got[i] ^ want[i]);
  return diff == 0;
}

void copy_str(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), std::min(cap - 1, s.size()));
}

std::string read_str(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }

PeerWire to_wire(const PeerInfo& p) {
  PeerWire w{};
  w.pid = p.pid;
  w.mesh_port = p.mesh_port;
  w.force_tcp = p.force_tcp;
  w.shm_domain = p.shm_domain;
  w.cpu_domain = p.cpu_domain;
  w.cpu_count = p.cpu_count;
  copy_str(w.ip, sizeof(w.ip), p.ip);
  copy_str(w.host, sizeof(w.host), p.host);
  return w;
}

PeerInfo from_wire(const PeerWire& w) {
  return {read_str(w.host, sizeof(w.host)), w.pid, read_str(w.ip, sizeof(w.ip)), w.mesh_port, w.force_tcp != 0,
          w.shm_domain, w.cpu_domain, w.cpu_count};
}

void send_error(int fd, const std::string& text, const Deadline& deadline) {
  if (fd < 0) return;
  TableHeaderWire h{kTableMagic, 1, 0, static_cast<uint32_t>(std::min<size_t>(text.size(), kMaxErrorText))};
  try {
    write_full(fd, &h, sizeof(h), deadline);
    write_full(fd, text.data(), h.text_len, deadline);
  } catch (const Error&) {
  }
}

// A launcher that reserved the port hands its listening socket to rank 0 as RINGTREE_LISTEN_FD.
int inherited_listener(uint16_t port) {
  const int64_t fd = env_int("RINGTREE_LISTEN_FD", -1);
  if (fd < 0) return -1;
  try {
    if (socket_local_port(static_cast<int>(fd)) == port) return static_cast<int>(fd);
  } catch (const Error&) {
  }
  return -1;
}

}  // namespace

Bootstrap::Bootstrap(int rank, int size, const UniqueId& uid, double timeout_s)
    : rank_(rank), size_(size), uid_(uid), deadline_(Deadline::after_seconds(timeout_s)) {
  RT_CHECK(size >= 1 && size <= kMaxRanks, InvalidArgument, "world size must be in [1, ", kMaxRanks, "], got ", size);
  RT_CHECK(rank >= 0 && rank < size, InvalidArgument, "rank must be in [0, ", size, "), got ", rank);
}

Bootstrap::~Bootstrap() { close_star(); }

void Bootstrap::close_star() {
  for (int& fd : star_fd_) close_fd(fd);
  star_fd_.clear();
}

Mesh Bootstrap::connect(const std::string& host_key, bool force_tcp, uint64_t shm_domain, uint64_t cpu_domain,
                        uint32_t cpu_count) {
  Mesh mesh;
  PeerInfo self{host_key, static_cast<int>(getpid()), "", 0, force_tcp, shm_domain, cpu_domain, cpu_count};
  int mesh_listener = -1;
  try {
    if (rank_ == 0) {
      self.ip = uid_.ip;
      mesh_listener = tcp_listen(self.ip, 0, 512);
      self.mesh_port = socket_local_port(mesh_listener);
      rendezvous_as_root(self, mesh);
    } else {
      int root_fd = tcp_connect(uid_.ip, uid_.port, deadline_);
      star_fd_ = {root_fd};
      // Listen on the interface that reaches rank 0: loopback for single-host jobs.
      self.ip = socket_local_ip(root_fd);
      mesh_listener = tcp_listen(self.ip, 0, 512);
      self.mesh_port = socket_local_port(mesh_listener);
      rendezvous_as_peer(self, mesh, root_fd);
    }
    connect_mesh(mesh, mesh_listener);
  } catch (...) {
    close_fd(mesh_listener);
    for (int& fd : mesh.ctrl_fd) close_fd(fd);
    for (int& fd : mesh.data_fd) close_fd(fd);
    for (int& fd : mesh.msg_fd) close_fd(fd);
    throw;
  }
  close_fd(mesh_listener);
  return mesh;
}

void Bootstrap::rendezvous_as_root(PeerInfo self, Mesh& mesh) {
  int listener = take_reserved_listener(uid_.port);
  if (listener < 0) listener = inherited_listener(uid_.port);
  if (listener >= 0) start_listening(listener, 512);
  else listener = tcp_listen(uid_.ip, uid_.port, 512);
  set_nonblocking(listener);
  star_fd_.assign(size_, -1);
  mesh.peers.assign(size_, PeerInfo{});
  mesh.peers[0] = self;
  int registered = 1;
  // Hellos are read as they arrive, from every connection at once: a stranger that connects and
  // stalls, or floods connections, costs one slot each and cannot hold up the real ranks.
  struct Pending {
    int fd;
    size_t got;
    HelloWire hello;
    Deadline deadline;
  };
  std::deque<Pending> pending;
  auto drop = [](Pending& p) { close_fd(p.fd); };
  auto fail_all = [&](const std::string& text) {
    for (Pending& p : pending) drop(p);
    for (int& fd : star_fd_) { send_error(fd, text, deadline_); close_fd(fd); }
    close_fd(listener);
    throw BootstrapError(text);
  };
  // A hello that arrived whole: register its rank, or explain why not.
  auto take_hello = [&](Pending& p) {
    const HelloWire& h = p.hello;
    if (h.magic != kHelloMagic || !secret_matches(h.secret, uid_.secret)) {
      drop(p);  // not one of ours: drop it, keep waiting for the real ranks
      return;
    }
    if (h.version != kVersion) {
      send_error(p.fd, str_cat("protocol version mismatch: rank ", h.rank, " speaks ", h.version, ", rank 0 speaks ", kVersion), deadline_);
      drop(p);
      fail_all(str_cat("protocol version mismatch with rank ", h.rank));
    }
    if (h.size != size_ || h.rank <= 0 || h.rank >= size_ || star_fd_[h.rank] >= 0) {
      std::string why =
          h.size != size_ ? str_cat("world size mismatch: a rank claiming rank ", h.rank, " was started with size ", h.size,
                                    " but rank 0 has size ", size_)
          : (h.rank <= 0 || h.rank >= size_) ? str_cat("rank out of range: a process claims rank ", h.rank, " in a world of size ", size_,
                                                        " (valid ranks are 0..", size_ - 1, ")")
                                              : str_cat("duplicate rank: two processes claim rank ", h.rank);
      send_error(p.fd, why, deadline_);
      drop(p);
      fail_all(why);
    }
    star_fd_[h.rank] = p.fd;
    p.fd = -1;
    mesh.peers[h.rank] = {read_str(h.host, sizeof(h.host)), h.pid, read_str(h.ip, sizeof(h.ip)), h.mesh_port,
                          h.force_tcp != 0, h.shm_domain, h.cpu_domain, h.cpu_count};
    ++registered;
  };
  std::vector<pollfd> fds;
  while (registered < size_) {
    if (deadline_.expired()) {
      std::string missing;
      for (int r = 1; r < size_; ++r)
        if (star_fd_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail_all(str_cat("bootstrap timed out: rank 0 at ", uid_.ip, ":", uid_.port, " heard from ", registered,
                       " of ", size_, " ranks; missing rank(s) ", missing));
    }
    fds.assign(1, pollfd{listener, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), deadline_.remaining_ms(100));
    if (n < 0 && errno != EINTR) throw_system_error("poll", errno);
    // Every hello that made progress; a connection that closed, erred or ran out of time goes.
    for (size_t i = 1; i < fds.size(); ++i) {
      Pending& p = pending[i - 1];
      if (fds[i].revents) {
        const ssize_t got = recv(p.fd, reinterpret_cast<uint8_t*>(&p.hello) + p.got, sizeof(p.hello) - p.got, MSG_DONTWAIT);
        if (got > 0) p.got += static_cast<size_t>(got);
        else if (got == 0 || (errno != EAGAIN && errno != EINTR)) drop(p);
        if (p.fd >= 0 && p.got == sizeof(p.hello)) take_hello(p);
      }
      if (p.fd >= 0 && p.deadline.expired()) drop(p);
    }
    while (!pending.empty() && pending.front().fd < 0) pending.pop_front();
    for (auto it = pending.begin(); it != pending.end();) it = it->fd < 0 ? pending.erase(it) : it + 1;
    // New connections; past the cap the oldest unfinished hello makes room.
    if (fds[0].revents) {
      for (;;) {
        int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        set_tcp_nodelay(fd);
        if (pending.size() >= kMaxPendingHellos) {
          drop(pending.front());
          pending.pop_front();
        }
        // A hello is a few hundred bytes: a connection has two seconds to deliver it.
        pending.push_back({fd, 0, HelloWire{}, Deadline::after_seconds(2.0)});
      }
    }
  }
  for (Pending& p : pending) drop(p);
  close_fd(listener);
  std::vector<PeerWire> table(size_);
  for (int r = 0; r < size_; ++r) table[r] = to_wire(mesh.peers[r]);
  TableHeaderWire th{kTableMagic, 0, size_, 0};
  for (int r = 1; r < size_; ++r) {
    write_full(star_fd_[r], &th, sizeof(th), deadline_);
    write_full(star_fd_[r], table.data(), table.size() * sizeof(PeerWire), deadline_);
  }
}

void Bootstrap::rendezvous_as_peer(PeerInfo self, Mesh& mesh, int root_fd) {
  HelloWire h{};
  h.magic = kHelloMagic;
  h.version = kVersion;
  std::memcpy(h.secret, uid_.secret.data(), 16);
  h.rank = rank_;
  h.size = size_;
  h.pid = self.pid;
  h.mesh_port = self.mesh_port;
  h.force_tcp = self.force_tcp;
  h.shm_domain = self.shm_domain;
  h.cpu_domain = self.cpu_domain;
  h.cpu_count = self.cpu_count;
  copy_str(h.ip, sizeof(h.ip), self.ip);
  copy_str(h.host, sizeof(h.host), self.host);
  write_full(root_fd, &h, sizeof(h), deadline_);
  TableHeaderWire th{};
  try {
    read_full(root_fd, &th, sizeof(th), deadline_);
  } catch (const Timeout&) {
    RT_THROW(Timeout, "bootstrap timed out: rank ", rank_, " reached rank 0 at ", uid_.ip, ":", uid_.port,
             " but not every rank arrived before the deadline");
  } catch (const PeerFailure&) {
    RT_THROW(BootstrapError, "rank 0 at ", uid_.ip, ":", uid_.port, " closed the connection during bootstrap",
             " (wrong unique id secret, or rank 0 failed)");
  }
  RT_CHECK(th.magic == kTableMagic, BootstrapError, "rank 0 answered with a bad bootstrap header");
  if (th.status != 0) {
    std::string text(std::min(th.text_len, kMaxErrorText), '\0');
    read_full(root_fd, text.data(), text.size(), deadline_);
    throw BootstrapError(text);
  }
  RT_CHECK(th.size == size_, BootstrapError, "rank 0 sent a table for ", th.size, " ranks, expected ", size_);
  std::vector<PeerWire> table(size_);
  read_full(root_fd, table.data(), table.size() * sizeof(PeerWire), deadline_);
  mesh.peers.resize(size_);
  for (int r = 0; r < size_; ++r) mesh.peers[r] = from_wire(table[r]);
}

void Bootstrap::connect_mesh(Mesh& mesh, int mesh_listener) {
  mesh.ctrl_fd.assign(size_, -1);
  mesh.data_fd.assign(size_, -1);
  mesh.msg_fd.assign(size_, -1);
  // Connect to every lower rank (the listen backlog completes these without an accept), then
  // accept from every higher rank: no ordering deadlock.
  for (int q = 0; q < rank_; ++q) {
    for (int32_t channel : pair_channels(mesh, rank_, q)) {
      int fd = tcp_connect(mesh.peers[q].ip, mesh.peers[q].mesh_port, deadline_);
      channel_fds(mesh, channel)[q] = fd;
      MeshHelloWire h{kMeshMagic, {}, rank_, channel};
      std::memcpy(h.secret, uid_.secret.data(), 16);
      write_full(fd, &h, sizeof(h), deadline_);
    }
  }
  size_t expected = 0;
  for (int q = rank_ + 1; q < size_; ++q) expected += pair_channels(mesh, rank_, q).size();
  while (expected > 0) {
    int fd = tcp_accept(mesh_listener, deadline_);
    RT_CHECK(fd >= 0, Timeout, "rank ", rank_, " timed out waiting for ", expected, " mesh connection(s) from higher ranks");
    MeshHelloWire h{};
    try {
      read_full(fd, &h, sizeof(h), Deadline::after_seconds(2.0));
    } catch (const Error&) {
      close_fd(fd);
      continue;
    }
    bool valid = h.magic == kMeshMagic && secret_matches(h.secret, uid_.secret) && h.rank > rank_ && h.rank < size_;
    if (valid) {
      const std::vector<int32_t> channels = pair_channels(mesh, rank_, h.rank);
      valid = std::find(channels.begin(), channels.end(), h.channel) != channels.end();
    }
    int* slot = valid ? &channel_fds(mesh, h.channel)[h.rank] : nullptr;
    if (!slot || *slot >= 0) { close_fd(fd); continue; }
    *slot = fd;
    --expected;
  }
}

void Bootstrap::barrier() { gather_then_release(false); }

void Bootstrap::confirm_setup() { gather_then_release(true); }

void Bootstrap::gather_then_release(bool release_may_fail) {
  char token = 1;
  if (size_ == 1) return;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) read_full(star_fd_[r], &token, 1, deadline_);
    for (int r = 1; r < size_; ++r) {
      try {
        write_full(star_fd_[r], &token, 1, deadline_);
      } catch (const Error&) {
        // confirm_setup: it said it was ready and died since; the communicator's first call
        // reports it.
        if (!release_may_fail) throw;
      }
    }
  } else {
    write_full(star_fd_[0], &token, 1, deadline_);
    read_full(star_fd_[0], &token, 1, deadline_);
  }
}

void Bootstrap::broadcast_from_root(void* data, size_t bytes) {
  if (size_ == 1) return;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) write_full(star_fd_[r], data, bytes, deadline_);
  } else {
    read_full(star_fd_[0], data, bytes, deadline_);
  }
}

// NTP-style, through rank 0: rank 0 pings each rank `rounds` times and keeps the exchange with
// the shortest round trip; the offset is the peer's clock at the reply minus the midpoint of rank
// 0's send and receive, good to half that round trip. Then rank 0 tells each rank its figures.
ClockOffset Bootstrap::estimate_clock_offset(int64_t (*now_ns)(), int rounds) {
  ClockOffset mine;
  if (size_ == 1) return mine;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) {
      ClockOffset best{0, INT64_MAX};
      for (int k = 0; k < rounds; ++k) {
        const int64_t t0 = now_ns();
        write_full(star_fd_[r], &t0, sizeof(t0), deadline_);
        int64_t t_peer = 0;
        read_full(star_fd_[r], &t_peer, sizeof(t_peer), deadline_);
        const int64_t t1 = now_ns();
        const int64_t half_rtt = (t1 - t0 + 1) / 2;
        if (half_rtt < best.error_ns) best = {t_peer - (t0 + (t1 - t0) / 2), half_rtt};
      }
      write_full(star_fd_[r], &best, sizeof(best), deadline_);
    }
  } else {
    for (int k = 0; k < rounds; ++k) {
      int64_t t0 = 0;
      read_full(star_fd_[0], &t0, sizeof(t0), deadline_);
      const int64_t t = now_ns();
      write_full(star_fd_[0], &t, sizeof(t), deadline_);
    }
    read_full(star_fd_[0], &mine, sizeof(mine), deadline_);
  }
  return mine;
}

}  // namespace ringtree
