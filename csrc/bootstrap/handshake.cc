#include "bootstrap/handshake.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include "bootstrap/socket.h"
#include "common/check.h"

namespace ringtree {

namespace {

constexpr uint32_t kHelloMagic = 0x52544231;      // "RTB1"
constexpr uint32_t kChallengeMagic = 0x52544348;  // "RTCH"
// A plain-text refusal (a wrong protocol version), laid out as protocol 4's table header so that
// a rank of that version prints it.
constexpr uint32_t kRefusalMagic = 0x52545442;  // "RTTB"
constexpr uint32_t kMaxText = 1024;
// Accepted connections whose handshake is unfinished, per listener; past it the oldest goes.
constexpr size_t kMaxPending = 1024;
// A handshake is a few hundred bytes: a connection has this long from accept to its proof.
constexpr double kStallSeconds = 2.0;
constexpr size_t kAcceptMacBytes = 16;

struct HelloWire {
  uint32_t magic, version;
  int32_t kind, rank, size, peer;  // peer: the rank it means to reach
  uint8_t nonce[16];
};
struct ChallengeWire {
  uint32_t magic, version;
  uint8_t nonce[16];
  uint8_t mac[32];
};
struct AcceptWire {
  int32_t status;
  uint32_t text_len;
  uint8_t mac[kAcceptMacBytes];
};
struct RefusalWire {
  uint32_t magic;
  int32_t status, size;
  uint32_t text_len;
};
static_assert(sizeof(HelloWire) == 40 && sizeof(ChallengeWire) == 56 && sizeof(AcceptWire) == 24 &&
                  sizeof(RefusalWire) == 16,
              "the handshake's wire layout is fixed (tests/security/wire.py mirrors it)");
constexpr size_t kProofMacBytes = 32;

// Reads toward `want` bytes: 1 once they are all in, 0 while more must come, -1 when the peer
// closed or the connection failed.
int read_toward(int fd, std::vector<uint8_t>& in, size_t& got, size_t want) {
  if (in.size() < want) in.resize(want);
  while (got < want) {
    const ssize_t n = ::recv(fd, in.data() + got, want - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      return -1;
    } else if (errno != EINTR) {
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
  }
  return 1;
}

// A handshake message goes whole into a fresh socket's buffer, or the peer is not a ringtree rank.
bool send_now(int fd, const void* data, size_t bytes) {
  for (;;) {
    const ssize_t n = ::send(fd, data, bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(bytes);
  }
}

void set_blocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

crypto::Digest accept_mac(const crypto::HmacKey& key, const Transcript& t, int32_t status, const std::string& text) {
  std::vector<uint8_t> extra(8 + text.size());
  const uint32_t len = static_cast<uint32_t>(text.size());
  std::memcpy(extra.data(), &status, 4);
  std::memcpy(extra.data() + 4, &len, 4);
  std::memcpy(extra.data() + 8, text.data(), text.size());
  return t.mac(key, "ringtree accept", extra.data(), extra.size());
}

}  // namespace

crypto::Digest Transcript::mac(const crypto::HmacKey& key, const char* label, const void* extra,
                               size_t extra_bytes) const {
  crypto::Sha256 h = key.begin();
  h.update(label, std::strlen(label) + 1);  // with its NUL: no label is a prefix of another's input
  h.update_value(kProtocolVersion);
  h.update_value(kind);
  h.update_value(client_rank);
  h.update_value(server_rank);
  h.update_value(size);
  h.update(setup.data(), setup.size());
  h.update(client_nonce.data(), client_nonce.size());
  h.update(server_nonce.data(), server_nonce.size());
  if (extra_bytes) h.update(extra, extra_bytes);
  return key.end(h);
}

void send_accept(const crypto::HmacKey& key, const Authenticated& a, int32_t status, const std::string& text,
                 const Deadline& deadline) {
  const std::string body = text.substr(0, kMaxText);
  AcceptWire w{status, static_cast<uint32_t>(body.size()), {}};
  const crypto::Digest mac = accept_mac(key, a.t, status, body);
  std::memcpy(w.mac, mac.data(), sizeof(w.mac));
  write_full(a.fd, &w, sizeof(w), deadline);
  write_full(a.fd, body.data(), body.size(), deadline);
}

// --- the loop ------------------------------------------------------------------------------

struct HandshakeLoop::Conn {
  int fd = -1;
  bool hello_done = false;  // then waiting for the proof
  std::vector<uint8_t> in;
  size_t got = 0;
  Transcript t;
  Deadline stall;
};

struct HandshakeLoop::Client {
  enum class Step { Waiting, Dialing, Reply, Refusal, Accept, Done };
  ClientSpec spec;
  Step step = Step::Waiting;
  int fd = -1;
  std::vector<uint8_t> in;
  size_t got = 0, want = 0;
  Transcript t;  // this attempt's, nonces included
  std::vector<uint8_t> payload;
  bool have_payload = false;
  Deadline retry_at = Deadline::after_seconds(0);
  int backoff_ms = 5;
  ClientStatus status;
};

HandshakeLoop::HandshakeLoop(const crypto::HmacKey& key, const Deadline& deadline) : key_(key), deadline_(deadline) {}

HandshakeLoop::~HandshakeLoop() {
  for (auto& c : pending_) close_fd(c->fd);
  for (auto& c : clients_) close_fd(c->fd);
}

void HandshakeLoop::serve(int listener, ServerRules rules) {
  listener_ = listener;
  rules_ = std::move(rules);
  set_nonblocking(listener_);
}

size_t HandshakeLoop::dial(ClientSpec spec) {
  auto c = std::make_unique<Client>();
  c->spec = std::move(spec);
  clients_.push_back(std::move(c));
  redial(*clients_.back());
  return clients_.size() - 1;
}

HandshakeLoop::ClientStatus HandshakeLoop::client_status(size_t index) const {
  const Client& c = *clients_.at(index);
  ClientStatus s = c.status;
  if (s.failure.empty() && (c.step == Client::Step::Reply || c.step == Client::Step::Accept))
    s.failure = "accepted the connection but did not finish the handshake";
  return s;
}

int HandshakeLoop::take_client_fd(size_t index) {
  Client& c = *clients_.at(index);
  RT_CHECK(c.step == Client::Step::Done, Error, "handshake with ", c.spec.who, " is not finished");
  const int fd = c.fd;
  c.fd = -1;
  return fd;
}

const Transcript& HandshakeLoop::client_transcript(size_t index) const { return clients_.at(index)->t; }

std::string HandshakeLoop::refusals() const {
  std::string out;
  for (const auto& [why, n] : refused_) out += str_cat(out.empty() ? "" : ", ", n, " connection(s) ", why);
  return out;
}

void HandshakeLoop::refuse(Conn& c, const std::string& counted_as) {
  close_fd(c.fd);
  for (auto& entry : refused_)
    if (entry.first == counted_as) {
      ++entry.second;
      return;
    }
  refused_.emplace_back(counted_as, 1);
}

// --- the client's side -----------------------------------------------------------------------

void HandshakeLoop::redial(Client& c) {
  c.step = Client::Step::Waiting;
  ++c.status.attempts;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(c.spec.port);
  RT_CHECK(inet_pton(AF_INET, c.spec.ip.c_str(), &a.sin_addr) == 1, InvalidArgument, "'", c.spec.ip,
           "' is not an IPv4 address");
  c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  RT_SYSCHECK(c.fd, "socket");
  if (connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 || errno == EINPROGRESS) {
    c.step = Client::Step::Dialing;  // poll says when it is through (POLLOUT)
    return;
  }
  client_failed(c, str_cat("nobody accepted a connection (", std::strerror(errno), ")"));
}

void HandshakeLoop::client_failed(Client& c, const std::string& why) {
  close_fd(c.fd);
  c.status.failure = why;
  c.step = Client::Step::Waiting;
  c.retry_at = Deadline::after_seconds(c.backoff_ms / 1000.0);
  c.backoff_ms = std::min(c.backoff_ms * 2, 100);
}

void HandshakeLoop::on_client_event(Client& c, short revents) {
  if (c.step == Client::Step::Dialing) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0 && !(revents & (POLLOUT | POLLERR | POLLHUP))) return;
    if (err != 0) return client_failed(c, str_cat("nobody accepted a connection (", std::strerror(err), ")"));
    c.status.connected = true;
    set_tcp_nodelay(c.fd);
    if (!c.have_payload) {
      if (c.spec.payload) c.payload = c.spec.payload(c.fd);
      c.have_payload = true;
    }
    c.t = c.spec.t;
    crypto::random_bytes(c.t.client_nonce.data(), c.t.client_nonce.size());
    HelloWire h{kHelloMagic, kProtocolVersion, c.t.kind, c.t.client_rank, c.t.size, c.t.server_rank, {}};
    std::memcpy(h.nonce, c.t.client_nonce.data(), sizeof(h.nonce));
    if (!send_now(c.fd, &h, sizeof(h))) return client_failed(c, "closed the connection before the hello");
    c.step = Client::Step::Reply;
    c.got = 0;
    c.want = sizeof(RefusalWire);  // the shorter of a challenge and a refusal: says which it is
    return;
  }
  for (;;) {
    const int r = read_toward(c.fd, c.in, c.got, c.want);
    if (r < 0)
      return client_failed(
          c, "closed the connection during the handshake (is it this job's rank, and this version of ringtree?)");
    if (r == 0) return;
    if (c.step == Client::Step::Reply) {
      uint32_t magic;
      std::memcpy(&magic, c.in.data(), 4);
      if (magic == kRefusalMagic && c.want == sizeof(RefusalWire)) {
        RefusalWire w;
        std::memcpy(&w, c.in.data(), sizeof(w));
        c.step = Client::Step::Refusal;
        c.want = sizeof(w) + std::min(w.text_len, kMaxText);
        continue;
      }
      if (magic != kChallengeMagic) return client_failed(c, "answered with something other than a ringtree challenge");
      if (c.want < sizeof(ChallengeWire)) {
        c.want = sizeof(ChallengeWire);
        continue;
      }
      ChallengeWire w;
      std::memcpy(&w, c.in.data(), sizeof(w));
      if (w.version != kProtocolVersion)
        return client_failed(c, str_cat("speaks ringtree protocol ", w.version, ", this rank ", kProtocolVersion));
      std::memcpy(c.t.server_nonce.data(), w.nonce, sizeof(w.nonce));
      const crypto::Digest expected = c.t.mac(key_, "ringtree server");
      if (!crypto::equal_constant_time(expected.data(), w.mac, expected.size()))
        return client_failed(c, "did not prove the job's secret");
      const crypto::Digest proof = c.t.mac(key_, "ringtree client", c.payload.data(), c.payload.size());
      std::vector<uint8_t> out(proof.begin(), proof.end());
      out.insert(out.end(), c.payload.begin(), c.payload.end());
      if (!send_now(c.fd, out.data(), out.size()))
        return client_failed(c, "closed the connection during the handshake");
      c.step = Client::Step::Accept;
      c.got = 0;
      c.want = sizeof(AcceptWire);
      continue;
    }
    if (c.step == Client::Step::Refusal) {
      const std::string text(reinterpret_cast<const char*>(c.in.data()) + sizeof(RefusalWire),
                             c.want - sizeof(RefusalWire));
      return client_failed(c, str_cat("refused this rank, unauthenticated: ", text));
    }
    // Step::Accept: the header, then its text.
    AcceptWire w;
    std::memcpy(&w, c.in.data(), sizeof(w));
    const size_t text_len = std::min(w.text_len, kMaxText);
    if (c.want < sizeof(w) + text_len) {
      c.want = sizeof(w) + text_len;
      continue;
    }
    const std::string text(reinterpret_cast<const char*>(c.in.data()) + sizeof(w), text_len);
    const crypto::Digest mac = accept_mac(key_, c.t, w.status, text);
    if (!crypto::equal_constant_time(mac.data(), w.mac, sizeof(w.mac)))
      return client_failed(c, "did not prove the job's secret (its accept)");
    if (w.status != 0) throw BootstrapError(text);
    set_blocking(c.fd);
    c.step = Client::Step::Done;
    c.status.done = true;
    c.status.failure.clear();
    return;
  }
}

// --- the server's side -----------------------------------------------------------------------

void HandshakeLoop::accept_new() {
  for (;;) {
    int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors: the oldest unfinished handshake makes room.
      if ((errno == EMFILE || errno == ENFILE) && !pending_.empty()) {
        refuse(*pending_.front(), "were dropped to make room for newer ones");
        pending_.pop_front();
        continue;
      }
      return;
    }
    set_tcp_nodelay(fd);
    if (pending_.size() >= kMaxPending) {
      refuse(*pending_.front(), "were dropped to make room for newer ones");
      pending_.pop_front();
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->stall = Deadline::after_seconds(kStallSeconds);
    pending_.push_back(std::move(c));
  }
}

void HandshakeLoop::on_server_event(Conn& c) {
  const size_t want = c.hello_done ? kProofMacBytes + rules_.payload_bytes : sizeof(HelloWire);
  const int r = read_toward(c.fd, c.in, c.got, want);
  if (r < 0) return refuse(c, "closed during the handshake");
  if (r == 0) return;
  if (!c.hello_done) {
    HelloWire h;
    std::memcpy(&h, c.in.data(), sizeof(h));
    if (h.magic != kHelloMagic) return refuse(c, "sent something other than a ringtree hello");
    if (h.version != kProtocolVersion) {
      const std::string text =
          str_cat("protocol version mismatch: a rank speaks ringtree protocol ", h.version,
                  ", the rank it reached speaks ", kProtocolVersion, " (every rank must run the same ringtree)");
      RefusalWire w{kRefusalMagic, 1, 0, static_cast<uint32_t>(text.size())};
      send_now(c.fd, &w, sizeof(w));
      send_now(c.fd, text.data(), text.size());
      return refuse(c, str_cat("spoke protocol version ", h.version));
    }
    Transcript t;
    if (!rules_.admit(HelloClaims{h.kind, h.rank, h.size, h.peer}, t))
      return refuse(c, "asked for a connection this rank does not expect");
    std::memcpy(t.client_nonce.data(), h.nonce, sizeof(h.nonce));
    crypto::random_bytes(t.server_nonce.data(), t.server_nonce.size());
    ChallengeWire w{kChallengeMagic, kProtocolVersion, {}, {}};
    std::memcpy(w.nonce, t.server_nonce.data(), sizeof(w.nonce));
    const crypto::Digest proof = t.mac(key_, "ringtree server");
    std::memcpy(w.mac, proof.data(), sizeof(w.mac));
    if (!send_now(c.fd, &w, sizeof(w))) return refuse(c, "closed during the handshake");
    c.t = t;
    c.hello_done = true;
    c.got = 0;
    return on_server_event(c);  // the proof may be here already
  }
  const uint8_t* payload = c.in.data() + kProofMacBytes;
  const crypto::Digest expected = c.t.mac(key_, "ringtree client", payload, rules_.payload_bytes);
  if (!crypto::equal_constant_time(expected.data(), c.in.data(), kProofMacBytes))
    return refuse(c, "did not prove the job's secret");
  Authenticated a;
  a.fd = c.fd;
  a.t = c.t;
  a.payload.assign(payload, payload + rules_.payload_bytes);
  c.fd = -1;
  set_blocking(a.fd);
  rules_.accept(std::move(a));
}

// --- driving both ------------------------------------------------------------------------------

void HandshakeLoop::run(const std::function<bool()>& served_enough, const std::function<void()>& on_deadline) {
  std::vector<pollfd> fds;
  std::vector<Client*> polled_clients;
  for (;;) {
    const bool clients_done =
        std::all_of(clients_.begin(), clients_.end(), [](const auto& c) { return c->status.done; });
    if (clients_done && served_enough()) return;
    if (deadline_.expired()) {
      on_deadline();
      RT_THROW(Timeout, "set-up timed out");  // on_deadline throws; this is the fallback
    }
    fds.clear();
    polled_clients.clear();
    int wait_ms = deadline_.remaining_ms(100);
    for (auto& c : clients_) {
      if (c->step == Client::Step::Waiting && !c->status.done) {
        wait_ms = std::min(wait_ms, c->retry_at.remaining_ms(100));
      } else if (c->step != Client::Step::Done) {
        fds.push_back({c->fd, static_cast<short>(c->step == Client::Step::Dialing ? POLLOUT : POLLIN), 0});
        polled_clients.push_back(c.get());
      }
    }
    const size_t first_pending = fds.size();
    for (const auto& p : pending_) fds.push_back({p->fd, POLLIN, 0});
    const size_t listener_at = fds.size();
    if (listener_ >= 0) fds.push_back({listener_, POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) throw_system_error("poll", errno);
    for (size_t i = 0; i < first_pending; ++i)
      if (fds[i].revents) on_client_event(*polled_clients[i], fds[i].revents);
    for (size_t i = first_pending; i < listener_at; ++i) {
      Conn& p = *pending_[i - first_pending];
      if (fds[i].revents && p.fd >= 0) on_server_event(p);
      if (p.fd >= 0 && p.stall.expired()) refuse(p, "stalled before finishing the handshake");
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return p->fd < 0; }),
                   pending_.end());
    if (listener_ >= 0 && fds[listener_at].revents) accept_new();
    for (auto& c : clients_)
      if (c->step == Client::Step::Waiting && !c->status.done && c->retry_at.expired() && !deadline_.expired())
        redial(*c);
  }
}

}  // namespace ringtree
