#include "ringtree/unique_id.h"

#include <unistd.h>
#include <algorithm>
#include <map>
#include <mutex>
#include "bootstrap/crypto.h"
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/settings.h"

namespace ringtree {

namespace {

std::mutex reserved_mu;
std::map<uint16_t, int>& reserved() {
  static std::map<uint16_t, int> m;
  return m;
}

// PBKDF2-HMAC-SHA256 rounds that stretch a seed into a secret: a guess at a human-chosen
// RINGTREE_SECRET costs an attacker this many HMACs (about 0.1 s on one core of a current x86
// server), not one hash.
constexpr uint32_t kSeedIterations = 200000;

// The port a unique id reserves: RINGTREE_PORT, else any free one (0).
uint16_t port_setting() {
  const int64_t port = setting_int(Setting::Port);
  RT_CHECK(port >= 0 && port <= 65535, InvalidArgument, "RINGTREE_PORT=", port,
           " is out of range: a TCP port is 1..65535 (0 or unset: any free port)");
  return static_cast<uint16_t>(port);
}

}  // namespace

UniqueId UniqueId::create(const std::string& ip) {
  UniqueId id;
  id.ip = resolve_ipv4(ip.empty() ? setting_str(Setting::Addr) : ip);
  // Bound, not listening: the port is ours, yet rank 0 may be another process (a launcher that
  // stays alive hands the token on), and nobody's connection lands in a queue no one accepts.
  int fd = tcp_bind(id.ip, port_setting());
  id.port = socket_local_port(fd);
  crypto::random_bytes(id.secret.data(), id.secret.size());
  std::lock_guard<std::mutex> lock(reserved_mu);
  auto& m = reserved();
  if (m.count(id.port)) ::close(m[id.port]);
  m[id.port] = fd;
  return id;
}

UniqueId UniqueId::from_seed(const std::string& ip, uint16_t port, const std::string& seed, const std::string& salt) {
  RT_CHECK(!seed.empty(), InvalidArgument, "UniqueId.from_seed: the seed is empty");
  RT_CHECK(port > 0, InvalidArgument, "UniqueId.from_seed: port must be in 1..65535, got ", port);
  UniqueId id;
  id.ip = resolve_ipv4(ip);
  id.port = port;
  // Salted with the job's own salt (random where the launcher has a channel for it, else the job's
  // ids), so that no dictionary of stretched guesses serves two jobs.
  const std::string full_salt = str_cat("ringtree seeded unique id v2|", port, "|", salt);
  std::array<uint8_t, 32> key;
  crypto::pbkdf2_sha256(seed.data(), seed.size(), full_salt.data(), full_salt.size(), kSeedIterations, key.data(),
                        key.size());
  std::copy(key.begin(), key.begin() + id.secret.size(), id.secret.begin());
  return id;
}

UniqueId UniqueId::child(const std::string& child_ip, uint16_t child_port, const std::array<uint8_t, 16>& nonce) const {
  RT_CHECK(child_port > 0, InvalidArgument, "a child unique id needs a port in 1..65535, got ", child_port);
  UniqueId id;
  id.ip = resolve_ipv4(child_ip);
  id.port = child_port;
  const crypto::HmacKey key(secret.data(), secret.size());
  crypto::Sha256 h = key.begin();
  const char label[] = "ringtree child unique id v1";
  h.update(label, sizeof(label));
  h.update(nonce.data(), nonce.size());
  h.update_value(id.port);
  h.update(id.ip.data(), id.ip.size());
  const crypto::Digest d = key.end(h);
  std::copy(d.begin(), d.begin() + id.secret.size(), id.secret.begin());
  return id;
}

int take_reserved_listener(uint16_t port) {
  std::lock_guard<std::mutex> lock(reserved_mu);
  auto& m = reserved();
  auto it = m.find(port);
  if (it == m.end()) return -1;
  int fd = it->second;
  m.erase(it);
  return fd;
}

std::string UniqueId::secret_hex() const { return crypto::to_hex(secret.data(), secret.size()); }

std::string UniqueId::str() const { return "rt1:" + ip + ":" + std::to_string(port) + ":" + secret_hex(); }

UniqueId UniqueId::parse(const std::string& token) {
  // The text never echoes the token, not even in part: any of it may be a secret.
  auto bad = [&](const char* why) {
    RT_THROW(InvalidArgument, "invalid ringtree unique id (", token.size(),
             " characters, not shown: it may hold the secret): ", why, " (expected rt1:<ipv4>:<port>:<32 hex digits>)");
  };
  if (token.rfind("rt1:", 0) != 0) bad("wrong prefix");
  size_t c2 = token.rfind(':');
  size_t c1 = token.rfind(':', c2 - 1);
  if (c1 == std::string::npos || c1 < 4 || c2 == std::string::npos) bad("missing fields");
  UniqueId id;
  id.ip = token.substr(4, c1 - 4);
  std::string port = token.substr(c1 + 1, c2 - c1 - 1), hex = token.substr(c2 + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) bad("bad port");
  long p = std::stol(port);
  if (p <= 0 || p > 65535) bad("port out of range");
  id.port = static_cast<uint16_t>(p);
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) bad("bad secret");
  for (size_t i = 0; i < 16; ++i) id.secret[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  id.ip = resolve_ipv4(id.ip);
  return id;
}

}  // namespace ringtree
