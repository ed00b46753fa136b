// Environment variables that are not ringtree's own (HOME, XDG_CACHE_HOME, ...). ringtree's
// settings are read through their rows in the settings table (common/settings.h).
#pragma once
#include <cstdint>
#include <string>

namespace ringtree {

int64_t env_int(const char* name, int64_t fallback);
double env_double(const char* name, double fallback);
std::string env_str(const char* name, const std::string& fallback);

}  // namespace ringtree
