// The job's rendezvous token: rank 0's address and port plus a random 128-bit secret that every
// connection must prove it holds (it never crosses the wire). str() is printable and parse()
// reads it back, so the token can travel by any channel the launcher trusts (MPI, a private
// file, the c10d store); whoever reads it can join the job.
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
  // A unique id at a fixed address and port with a secret stretched from `seed` (a shared
  // secret such as RINGTREE_SECRET) by PBKDF2-HMAC-SHA256, salted with the port and `salt` (the
  // job's: one dictionary must not serve two jobs); nothing is bound.
  static UniqueId from_seed(const std::string& ip, uint16_t port, const std::string& seed,
                            const std::string& salt = {});
  // The unique id of a communicator made from this one's ranks (split, shrink, grow): its
  // secret is an HMAC of this secret over a public nonce and the address, so only the nonce,
  // address and port need to travel between the ranks.
  UniqueId child(const std::string& ip, uint16_t port, const std::array<uint8_t, 16>& nonce) const;
  std::string str() const;
  std::string secret_hex() const;
};

// The socket UniqueId::create() bound for `port` (not yet listening), or -1; ownership passes to the caller.
int take_reserved_listener(uint16_t port);

}  // namespace ringtree
