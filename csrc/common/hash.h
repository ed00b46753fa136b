// FNV-1a over 64-bit words: cheap, stable across processes and builds, for fingerprints and
// identities every rank must compute alike (not for secrets).
#pragma once
#include <cstdint>

namespace ringtree {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

inline uint64_t fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace ringtree
