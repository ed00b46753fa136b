#include "common/env.h"

#include <cstdlib>
#include <string>
#include "common/check.h"

namespace ringtree {

static const char* lookup(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = lookup(name);
  if (!v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  RT_CHECK(end && *end == '\0', InvalidArgument, "setting ", name, "='", v, "' is not an integer");
  return x;
}

double env_double(const char* name, double fallback) {
  const char* v = lookup(name);
  if (!v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  RT_CHECK(end && *end == '\0', InvalidArgument, "setting ", name, "='", v, "' is not a number");
  return x;
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = lookup(name);
  return v ? std::string(v) : fallback;
}

}  // namespace ringtree
