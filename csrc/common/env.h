// Settings: each is read from the environment where it is used, once, and documented in the
// README's settings table (NCCL_PARAM pattern). Tests that change a setting start new processes.
#pragma once
#include <cstdint>
#include <string>

namespace ringtree {

int64_t env_int(const char* name, int64_t fallback);
double env_double(const char* name, double fallback);
std::string env_str(const char* name, const std::string& fallback);

}  // namespace ringtree

// Declares a cached integer setting as a function: RT_PARAM(ShmRingBytes, "RINGTREE_SHM_RING_BYTES", 1 << 20)
#define RT_PARAM(fn, env_name, fallback)                                  \
  static int64_t fn() {                                                   \
    static const int64_t value = ::ringtree::env_int(env_name, fallback); \
    return value;                                                         \
  }
