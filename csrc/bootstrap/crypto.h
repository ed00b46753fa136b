// The few primitives the authenticated set-up needs, written here so that a fresh machine needs
// no crypto library: SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), PBKDF2-HMAC-SHA256
// (RFC 8018), a constant-time comparison and the kernel's random bytes. Only set-up uses them;
// no collective calls any of this.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringtree::crypto {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  template <typename T>
  void update_value(const T& v) {
    update(&v, sizeof(v));
  }  // fixed-size fields, as laid out on the wire
  Digest finish();

 private:
  void compress(const uint8_t* block);
  uint32_t state_[8];
  uint8_t block_[64];
  size_t used_ = 0;     // bytes in block_
  uint64_t total_ = 0;  // bytes hashed so far
};

Digest sha256(const void* data, size_t bytes);

// A key's inner and outer hash states, computed once: each MAC then costs the message's blocks
// plus two.
class HmacKey {
 public:
  HmacKey() = default;
  HmacKey(const void* key, size_t bytes);
  // A MAC over several pieces: Sha256 h = key.begin(); h.update(...); ...; key.end(h).
  Sha256 begin() const { return inner_; }
  Digest end(Sha256& inner) const;
  Digest mac(const void* data, size_t bytes) const;

 private:
  Sha256 inner_, outer_;
};

// PBKDF2-HMAC-SHA256: `out_bytes` of key stretched from a password by `iterations` rounds.
void pbkdf2_sha256(const void* password, size_t password_bytes, const void* salt, size_t salt_bytes,
                   uint32_t iterations, uint8_t* out, size_t out_bytes);

// True when the n bytes are equal; the time taken does not depend on where they differ.
bool equal_constant_time(const uint8_t* a, const uint8_t* b, size_t n);

// n bytes from the kernel's random generator (getrandom; blocks only before it is seeded at boot).
void random_bytes(uint8_t* out, size_t n);

std::string to_hex(const uint8_t* data, size_t n);

}  // namespace ringtree::crypto
