#include "bootstrap/bootstrap.h"

#include <unistd.h>
#include <algorithm>
#include <climits>
#include <cstring>
#include "bootstrap/handshake.h"
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/settings.h"

namespace ringtree {

namespace {

constexpr uint32_t kTableMagic = 0x52545442;  // "RTTB"
constexpr int kMaxRanks = 1 << 16;
constexpr uint32_t kMaxErrorText = 1024;
constexpr size_t kSealBytes = 16;  // the MAC after each sealed star message
constexpr uint8_t kFromRoot = 1, kToRoot = 2;

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

// The connections a pair makes: control and message always, data when the pair talks TCP.
std::vector<int32_t> pair_channels(const Mesh& mesh, int a, int b) {
  if (mesh.pair_uses_tcp(a, b)) return {kControlLink, kDataLink, kMessageLink};
  return {kControlLink, kMessageLink};
}

std::vector<int>& channel_fds(Mesh& mesh, int32_t channel) {
  return channel == kControlLink ? mesh.ctrl_fd : channel == kDataLink ? mesh.data_fd : mesh.msg_fd;
}

const char* channel_name(int32_t channel) {
  return channel == kControlLink ? "control" : channel == kDataLink ? "data" : "message";
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
  return {read_str(w.host, sizeof(w.host)),
          w.pid,
          read_str(w.ip, sizeof(w.ip)),
          w.mesh_port,
          w.force_tcp != 0,
          w.shm_domain,
          w.cpu_domain,
          w.cpu_count};
}

// A launcher that reserved the port hands its listening socket to rank 0 as RINGTREE_LISTEN_FD.
int inherited_listener(uint16_t port) {
  const int64_t fd = setting_auto_int(Setting::ListenFd).value_or(-1);
  if (fd < 0 || fd > INT32_MAX) return -1;
  try {
    if (socket_local_port(static_cast<int>(fd)) == port) return static_cast<int>(fd);
  } catch (const Error&) {
  }
  return -1;
}

// The key under which rank 0 and one rank seal what they say after their handshake.
crypto::HmacKey session_key(const crypto::HmacKey& secret, const Transcript& t) {
  const crypto::Digest k = t.mac(secret, "ringtree star session");
  return crypto::HmacKey(k.data(), k.size());
}

// The MAC of one sealed message: its direction and number bind it to its place in the stream.
crypto::Digest seal(const crypto::HmacKey& key, uint8_t dir, uint64_t count, const void* data, size_t bytes) {
  crypto::Sha256 h = key.begin();
  h.update_value(dir);
  h.update_value(count);
  h.update(data, bytes);
  return key.end(h);
}

std::string where(const UniqueId& uid) { return str_cat(uid.ip, ":", uid.port); }

}  // namespace

Bootstrap::Bootstrap(int rank, int size, const UniqueId& uid, double timeout_s)
    : rank_(rank),
      size_(size),
      uid_(uid),
      secret_key_(uid.secret.data(), uid.secret.size()),
      deadline_(Deadline::after_seconds(timeout_s)) {
  RT_CHECK(size >= 1 && size <= kMaxRanks, InvalidArgument, "world size must be in [1, ", kMaxRanks, "], got ", size);
  RT_CHECK(rank >= 0 && rank < size, InvalidArgument, "rank must be in [0, ", size, "), got ", rank);
}

Bootstrap::~Bootstrap() { close_star(); }

void Bootstrap::close_star() {
  for (StarLink& link : star_) close_fd(link.fd);
  star_.clear();
}

// A message and its MAC go in one write and come in one read: set-up's ping-pongs (barriers,
// clock offsets) pay one system call a side, not two.
void Bootstrap::send_sealed(int r, const void* data, size_t bytes) {
  StarLink& link = star_[r];
  const crypto::Digest mac = seal(link.key, rank_ == 0 ? kFromRoot : kToRoot, link.sent++, data, bytes);
  std::vector<uint8_t> out(bytes + kSealBytes);
  std::memcpy(out.data(), data, bytes);
  std::memcpy(out.data() + bytes, mac.data(), kSealBytes);
  write_full(link.fd, out.data(), out.size(), deadline_);
}

void Bootstrap::recv_sealed(int r, void* data, size_t bytes) {
  StarLink& link = star_[r];
  std::vector<uint8_t> in(bytes + kSealBytes);
  read_full(link.fd, in.data(), in.size(), deadline_);
  std::memcpy(data, in.data(), bytes);
  const crypto::Digest mac = seal(link.key, rank_ == 0 ? kToRoot : kFromRoot, link.received++, data, bytes);
  RT_CHECK(crypto::equal_constant_time(mac.data(), in.data() + bytes, kSealBytes), BootstrapError,
           "a set-up message from ", rank_ == 0 ? str_cat("rank ", r) : str_cat("rank 0 at ", where(uid_)),
           " failed its authentication check: the connection was tampered with");
}

Mesh Bootstrap::connect(const std::string& host_key, bool force_tcp, uint64_t shm_domain, uint64_t cpu_domain,
                        uint32_t cpu_count) {
  Mesh mesh;
  PeerInfo self{host_key, static_cast<int>(getpid()), "", 0, force_tcp, shm_domain, cpu_domain, cpu_count};
  int mesh_listener = -1;
  std::array<uint8_t, 16> setup{};
  try {
    if (rank_ == 0) {
      self.ip = uid_.ip;
      mesh_listener = tcp_listen(self.ip, 0, 512);
      self.mesh_port = socket_local_port(mesh_listener);
      rendezvous_as_root(self, mesh, setup);
    } else {
      rendezvous_as_peer(self, mesh, mesh_listener, setup);
    }
    mesh.public_id = crypto::to_hex(setup.data(), 8);
    connect_mesh(mesh, mesh_listener, setup);
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

void Bootstrap::rendezvous_as_root(PeerInfo self, Mesh& mesh, std::array<uint8_t, 16>& setup) {
  int listener = take_reserved_listener(uid_.port);
  if (listener < 0) listener = inherited_listener(uid_.port);
  if (listener >= 0)
    start_listening(listener, 512);
  else
    listener = tcp_listen(uid_.ip, uid_.port, 512);
  struct ListenerCloser {
    int& fd;
    ~ListenerCloser() { close_fd(fd); }
  } closer{listener};
  star_.assign(size_, StarLink{});
  mesh.peers.assign(size_, PeerInfo{});
  mesh.peers[0] = self;
  int registered = 1;
  HandshakeLoop loop(secret_key_, deadline_);
  // A misconfigured rank (it proved the secret) is explained to every rank, not left hanging.
  auto fail_all = [&](const std::string& text) {
    const TableHeaderWire h{kTableMagic, 1, 0, static_cast<uint32_t>(std::min<size_t>(text.size(), kMaxErrorText))};
    for (int r = 1; r < size_; ++r) {
      if (star_[r].fd < 0) continue;
      try {
        send_sealed(r, &h, sizeof(h));
        send_sealed(r, text.data(), h.text_len);
      } catch (const Error&) {
      }
    }
    throw BootstrapError(text);
  };
  ServerRules rules;
  rules.payload_bytes = sizeof(PeerWire);
  // Anyone may ask: the hello claims nothing yet. Its rank and size are checked once it proved
  // the secret (a stranger must not be able to fail the job by claiming a taken rank).
  rules.admit = [&](const HelloClaims& h, Transcript& t) {
    if (h.kind != kStarLink || h.peer != 0) return false;
    t.kind = kStarLink;
    t.client_rank = h.rank;
    t.server_rank = 0;
    t.size = h.size;
    return true;
  };
  rules.accept = [&](Authenticated&& a) {
    const int r = a.t.client_rank;
    const std::string why =
        a.t.size != size_        ? str_cat("world size mismatch: a rank claiming rank ", r, " was started with size ",
                                           a.t.size, " but rank 0 has size ", size_)
        : (r <= 0 || r >= size_) ? str_cat("rank out of range: a process claims rank ", r, " in a world of size ",
                                           size_, " (valid ranks are 0..", size_ - 1, ")")
        : star_[r].fd >= 0       ? str_cat("duplicate rank: two processes claim rank ", r)
                                 : std::string();
    if (!why.empty()) {
      try {
        send_accept(secret_key_, a, 1, why, deadline_);
      } catch (const Error&) {
      }
      close_fd(a.fd);
      fail_all(why);
    }
    PeerWire w;
    std::memcpy(&w, a.payload.data(), sizeof(w));
    star_[r].fd = a.fd;
    star_[r].key = session_key(secret_key_, a.t);
    mesh.peers[r] = from_wire(w);
    ++registered;
    send_accept(secret_key_, a, 0, "", deadline_);
  };
  loop.serve(listener, std::move(rules));
  loop.run([&] { return registered == size_; },
           [&] {
             std::string missing;
             for (int r = 1; r < size_; ++r)
               if (star_[r].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
             const std::string refused = loop.refusals();
             fail_all(str_cat("bootstrap timed out: rank 0 at ", where(uid_), " heard from ", registered, " of ", size_,
                              " ranks; missing rank(s) ", missing, refused.empty() ? "" : "; refused: " + refused));
           });
  close_fd(listener);
  crypto::random_bytes(setup.data(), setup.size());
  std::vector<uint8_t> body(size_ * sizeof(PeerWire) + setup.size());
  for (int r = 0; r < size_; ++r) {
    const PeerWire w = to_wire(mesh.peers[r]);
    std::memcpy(body.data() + r * sizeof(PeerWire), &w, sizeof(w));
  }
  std::memcpy(body.data() + size_ * sizeof(PeerWire), setup.data(), setup.size());
  const TableHeaderWire th{kTableMagic, 0, size_, 0};
  for (int r = 1; r < size_; ++r) {
    send_sealed(r, &th, sizeof(th));
    send_sealed(r, body.data(), body.size());
  }
}

void Bootstrap::rendezvous_as_peer(PeerInfo& self, Mesh& mesh, int& mesh_listener, std::array<uint8_t, 16>& setup) {
  HandshakeLoop loop(secret_key_, deadline_);
  ClientSpec spec;
  spec.ip = uid_.ip;
  spec.port = uid_.port;
  spec.t.kind = kStarLink;
  spec.t.client_rank = rank_;
  spec.t.server_rank = 0;
  spec.t.size = size_;
  spec.who = str_cat("rank 0 at ", where(uid_));
  // Listen on the interface that reaches rank 0 (loopback for single-host jobs); the proof
  // carries where.
  spec.payload = [&](int fd) {
    if (mesh_listener < 0) {
      self.ip = socket_local_ip(fd);
      mesh_listener = tcp_listen(self.ip, 0, 512);
      self.mesh_port = socket_local_port(mesh_listener);
    }
    const PeerWire w = to_wire(self);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&w);
    return std::vector<uint8_t>(p, p + sizeof(w));
  };
  const size_t root = loop.dial(std::move(spec));
  loop.run(
      [] { return true; },
      [&] {
        const HandshakeLoop::ClientStatus s = loop.client_status(root);
        if (!s.connected)
          RT_THROW(Timeout, "bootstrap timed out: rank ", rank_, " found nobody accepting connections at ", where(uid_),
                   " (", s.failure, "); is rank 0 running with the same unique id?");
        RT_THROW(
            BootstrapError, "rank 0 at ", where(uid_), " ", s.failure, " (rank ", rank_, " tried ", s.attempts,
            " time(s) before the deadline); whatever listens there is not this job's rank 0, or runs another ringtree");
      });
  star_.assign(1, StarLink{});
  star_[0].fd = loop.take_client_fd(root);
  star_[0].key = session_key(secret_key_, loop.client_transcript(root));
  TableHeaderWire th{};
  try {
    recv_sealed(0, &th, sizeof(th));
  } catch (const Timeout&) {
    RT_THROW(Timeout, "bootstrap timed out: rank ", rank_, " reached rank 0 at ", where(uid_),
             " but not every rank arrived before the deadline");
  } catch (const PeerFailure&) {
    RT_THROW(BootstrapError, "rank 0 at ", where(uid_), " closed the connection during bootstrap (rank 0 failed)");
  }
  RT_CHECK(th.magic == kTableMagic, BootstrapError, "rank 0 answered with a bad bootstrap header");
  if (th.status != 0) {
    std::string text(std::min(th.text_len, kMaxErrorText), '\0');
    recv_sealed(0, text.data(), text.size());
    throw BootstrapError(text);
  }
  RT_CHECK(th.size == size_, BootstrapError, "rank 0 sent a table for ", th.size, " ranks, expected ", size_);
  std::vector<uint8_t> body(size_ * sizeof(PeerWire) + setup.size());
  recv_sealed(0, body.data(), body.size());
  mesh.peers.resize(size_);
  for (int r = 0; r < size_; ++r) {
    PeerWire w;
    std::memcpy(&w, body.data() + r * sizeof(PeerWire), sizeof(w));
    mesh.peers[r] = from_wire(w);
  }
  std::memcpy(setup.data(), body.data() + size_ * sizeof(PeerWire), setup.size());
}

void Bootstrap::connect_mesh(Mesh& mesh, int mesh_listener, const std::array<uint8_t, 16>& setup) {
  mesh.ctrl_fd.assign(size_, -1);
  mesh.data_fd.assign(size_, -1);
  mesh.msg_fd.assign(size_, -1);
  if (size_ == 1) return;
  // Every connection to a lower rank is dialled, and every one from a higher rank answered, at
  // once: nobody waits for another rank's turn, and a stranger that stalls a connection to one
  // of the listeners holds up nothing.
  HandshakeLoop loop(secret_key_, deadline_);
  struct Dialled {
    size_t index;
    int peer;
    int32_t channel;
  };
  std::vector<Dialled> dialled;
  for (int q = 0; q < rank_; ++q) {
    for (int32_t channel : pair_channels(mesh, rank_, q)) {
      ClientSpec spec;
      spec.ip = mesh.peers[q].ip;
      spec.port = mesh.peers[q].mesh_port;
      spec.t.kind = channel;
      spec.t.client_rank = rank_;
      spec.t.server_rank = q;
      spec.t.size = size_;
      spec.t.setup = setup;
      spec.who = str_cat("rank ", q, " at ", spec.ip, ":", spec.port);
      dialled.push_back({loop.dial(std::move(spec)), q, channel});
    }
  }
  size_t expected = 0;
  for (int q = rank_ + 1; q < size_; ++q) expected += pair_channels(mesh, rank_, q).size();
  size_t answered = 0;
  ServerRules rules;
  rules.admit = [&](const HelloClaims& h, Transcript& t) {
    if (h.peer != rank_ || h.size != size_ || h.rank <= rank_ || h.rank >= size_) return false;
    const std::vector<int32_t> channels = pair_channels(mesh, rank_, h.rank);
    if (std::find(channels.begin(), channels.end(), h.kind) == channels.end()) return false;
    t.kind = h.kind;
    t.client_rank = h.rank;
    t.server_rank = rank_;
    t.size = size_;
    t.setup = setup;
    return true;
  };
  rules.accept = [&](Authenticated&& a) {
    int& slot = channel_fds(mesh, a.t.kind)[a.t.client_rank];
    // A second proven connection for one slot is the client's retry (it never saw our accept).
    if (slot >= 0)
      close_fd(slot);
    else
      ++answered;
    slot = a.fd;
    send_accept(secret_key_, a, 0, "", deadline_);
  };
  if (expected > 0) loop.serve(mesh_listener, std::move(rules));
  loop.run([&] { return answered == expected; },
           [&] {
             std::string missing;
             for (const Dialled& d : dialled) {
               const HandshakeLoop::ClientStatus s = loop.client_status(d.index);
               if (!s.done)
                 missing += str_cat(missing.empty() ? "" : "; ", channel_name(d.channel), " connection to rank ",
                                    d.peer, ": ", s.failure.empty() ? "no answer" : s.failure);
             }
             for (int q = rank_ + 1; q < size_; ++q)
               for (int32_t channel : pair_channels(mesh, rank_, q))
                 if (channel_fds(mesh, channel)[q] < 0)
                   missing += str_cat(missing.empty() ? "" : "; ", channel_name(channel), " connection from rank ", q,
                                      " never came");
             const std::string refused = loop.refusals();
             RT_THROW(Timeout, "rank ", rank_, " timed out forming the connection mesh: ", missing,
                      refused.empty() ? "" : "; refused: " + refused);
           });
  for (const Dialled& d : dialled) channel_fds(mesh, d.channel)[d.peer] = loop.take_client_fd(d.index);
}

void Bootstrap::barrier() { gather_then_release(false); }

void Bootstrap::confirm_setup() { gather_then_release(true); }

void Bootstrap::gather_then_release(bool release_may_fail) {
  char token = 1;
  if (size_ == 1) return;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) recv_sealed(r, &token, 1);
    for (int r = 1; r < size_; ++r) {
      try {
        send_sealed(r, &token, 1);
      } catch (const Error&) {
        // confirm_setup: it said it was ready and died since; the communicator's first call
        // reports it.
        if (!release_may_fail) throw;
      }
    }
  } else {
    send_sealed(0, &token, 1);
    recv_sealed(0, &token, 1);
  }
}

void Bootstrap::all_gather(const void* mine, void* all, size_t bytes) {
  uint8_t* out = static_cast<uint8_t*>(all);
  std::memcpy(out + static_cast<size_t>(rank_) * bytes, mine, bytes);
  if (size_ == 1) return;
  const size_t total = static_cast<size_t>(size_) * bytes;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) recv_sealed(r, out + static_cast<size_t>(r) * bytes, bytes);
    for (int r = 1; r < size_; ++r) send_sealed(r, out, total);
  } else {
    send_sealed(0, mine, bytes);
    recv_sealed(0, out, total);
  }
}

void Bootstrap::broadcast_from_root(void* data, size_t bytes) {
  if (size_ == 1) return;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) send_sealed(r, data, bytes);
  } else {
    recv_sealed(0, data, bytes);
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
        send_sealed(r, &t0, sizeof(t0));
        int64_t t_peer = 0;
        recv_sealed(r, &t_peer, sizeof(t_peer));
        const int64_t t1 = now_ns();
        const int64_t half_rtt = (t1 - t0 + 1) / 2;
        if (half_rtt < best.error_ns) best = {t_peer - (t0 + (t1 - t0) / 2), half_rtt};
      }
      send_sealed(r, &best, sizeof(best));
    }
  } else {
    for (int k = 0; k < rounds; ++k) {
      int64_t t0 = 0;
      recv_sealed(0, &t0, sizeof(t0));
      const int64_t t = now_ns();
      send_sealed(0, &t, sizeof(t));
    }
    recv_sealed(0, &mine, sizeof(mine));
  }
  return mine;
}

}  // namespace ringtree
