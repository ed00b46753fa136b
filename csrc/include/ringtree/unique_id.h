// The job's rendezvous token: rank 0's address and port plus a random 128-bit secret that every
// connection must present. str() is printable and parse() reads it back, so the token can
// travel by any means (MPI, a file, an environment variable).
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace ringtree {

struct UniqueId {
  std::string ip;  // IPv4, dotted
  uint16_t port = 0;
  std::array<uint8_t, 16> secret{};

  // Binds a socket now (kept for rank 0, if it is this process or inherits it) so the port stays
  // ours; it listens only once rank 0 takes it. ip: the given one, else RINGTREE_ADDR, else
  // loopback.
  static UniqueId create(const std::string& ip = {});
  static UniqueId parse(const std::string& token);
  // A unique id at a fixed address and port with a secret derived from `seed`; for launchers
  // (torchrun) whose ranks share only an address, a port and a run id. Nothing is bound.
  static UniqueId from_seed(const std::string& ip, uint16_t port, const std::string& seed);
  std::string str() const;
  std::string secret_hex() const;
};

// The socket UniqueId::create() bound for `port` (not yet listening), or -1; ownership passes to the caller.
int take_reserved_listener(uint16_t port);

}  // namespace ringtree
