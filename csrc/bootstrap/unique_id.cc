#include "ringtree/unique_id.h"

#include <sys/random.h>
#include <unistd.h>
#include <cerrno>
#include <map>
#include <mutex>
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/env.h"

namespace ringtree {

namespace {

std::mutex reserved_mu;
std::map<uint16_t, int>& reserved() {
  static std::map<uint16_t, int> m;
  return m;
}

void fill_random(uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_system_error("getrandom", errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

// FNV-1a over the seed, stretched by rehashing: not a KDF, only enough to make the derived
// secret unguessable to someone who does not know the seed.
void derive_secret(const std::string& seed, std::array<uint8_t, 16>& out) {
  uint64_t h1 = 1469598103934665603ull, h2 = 0x9e3779b97f4a7c15ull;
  for (int round = 0; round < 64; ++round)
    for (unsigned char c : seed) {
      h1 = (h1 ^ c) * 1099511628211ull;
      h2 = (h2 ^ (c + round)) * 0x100000001b3ull + (h1 >> 7);
    }
  for (int i = 0; i < 8; ++i) { out[i] = static_cast<uint8_t>(h1 >> (8 * i)); out[8 + i] = static_cast<uint8_t>(h2 >> (8 * i)); }
}

}  // namespace

UniqueId UniqueId::create(const std::string& ip) {
  UniqueId id;
  id.ip = resolve_ipv4(ip.empty() ? env_str("RINGTREE_ADDR", "127.0.0.1") : ip);
  // Bound, not listening: the port is ours, yet rank 0 may be another process (a launcher that
  // stays alive hands the token on), and nobody's connection lands in a queue no one accepts.
  int fd = tcp_bind(id.ip, static_cast<uint16_t>(env_int("RINGTREE_PORT", 0)));
  id.port = socket_local_port(fd);
  fill_random(id.secret.data(), id.secret.size());
  std::lock_guard<std::mutex> lock(reserved_mu);
  auto& m = reserved();
  if (m.count(id.port)) ::close(m[id.port]);
  m[id.port] = fd;
  return id;
}

UniqueId UniqueId::from_seed(const std::string& ip, uint16_t port, const std::string& seed) {
  UniqueId id;
  id.ip = resolve_ipv4(ip);
  id.port = port;
  derive_secret(seed, id.secret);
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

std::string UniqueId::secret_hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : secret) { s += digits[b >> 4]; s += digits[b & 15]; }
  return s;
}

std::string UniqueId::str() const { return "rt1:" + ip + ":" + std::to_string(port) + ":" + secret_hex(); }

UniqueId UniqueId::parse(const std::string& token) {
  auto bad = [&](const char* why) {
    RT_THROW(InvalidArgument, "invalid ringtree unique id '", token, "': ", why,
             " (expected rt1:<ipv4>:<port>:<32 hex digits>)");
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
