// Precondition checks that print both values (GLOO_ENFORCE_EQ style) and throw typed errors.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include "ringtree/errors.h"

namespace ringtree {

// Message formatting without iostreams: some toolchains link a static libstdc++ into the
// module whose locale facets crash when used from a shared object (seen on the GPU image),
// and error paths must never crash.
inline void str_append(std::string& out, const std::string& s) { out += s; }
inline void str_append(std::string& out, const char* s) { out += s ? s : "(null)"; }
inline void str_append(std::string& out, char c) { out += c; }
inline void str_append(std::string& out, bool b) { out += b ? "true" : "false"; }
template <typename T>
std::enable_if_t<std::is_integral_v<T>> str_append(std::string& out, T v) {
  out += std::to_string(v);
}
template <typename T>
std::enable_if_t<std::is_floating_point_v<T>> str_append(std::string& out, T v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  out += buf;
}

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::string out;
  (str_append(out, args), ...);
  return out;
}

[[noreturn]] void throw_system_error(const std::string& what, int err);

inline bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace ringtree

#define RT_THROW(Kind, ...) throw ::ringtree::Kind(::ringtree::str_cat(__VA_ARGS__))
#define RT_CHECK(cond, Kind, ...)             \
  do {                                        \
    if (!(cond)) RT_THROW(Kind, __VA_ARGS__); \
  } while (0)
#define RT_CHECK_EQ(a, b, what)                                                                    \
  do {                                                                                             \
    auto rt_a_ = (a);                                                                              \
    auto rt_b_ = (b);                                                                              \
    if (!(rt_a_ == rt_b_)) RT_THROW(InvalidArgument, what, ": expected ", rt_b_, ", got ", rt_a_); \
  } while (0)
#define RT_SYSCHECK(expr, what)                                  \
  do {                                                           \
    if ((expr) < 0) ::ringtree::throw_system_error(what, errno); \
  } while (0)
