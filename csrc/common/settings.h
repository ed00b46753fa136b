// Every environment setting ringtree reads, C++ and Python alike, declared once in the table
// settings.def: its name, its default, the part of the library it belongs to and what it does. The
// code reads a setting through its row, so the default in force is the default documented; the
// manual's settings page is generated from this table, and a test refuses a RINGTREE_ name used
// anywhere in the sources that the table lacks.
//
// A setting is read once per process where it is used (RT_SETTING below caches it), so tests
// that change one start new processes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace ringtree {

// Groups, in the order the manual lists them.
#define RINGTREE_SETTING_GROUPS(G)                  \
  G(Launch, "Set-up and launching")                 \
  G(Choice, "Algorithms and the cost model")        \
  G(Host, "Shared memory, single copy and waiting") \
  G(Tcp, "TCP")                                     \
  G(Gpu, "GPU")                                     \
  G(Diagnostics, "Diagnostics")                     \
  G(Testing, "Test hooks (for the project's own tests)")

enum class SettingGroup : int {
#define RT_SETTING_GROUP_ID(id, title) id,
  RINGTREE_SETTING_GROUPS(RT_SETTING_GROUP_ID)
#undef RT_SETTING_GROUP_ID
      Count
};

enum class Setting : int {
#define RT_SETTING_ROW(id, name, fallback, group, text) id,
#include "common/settings.def"
#undef RT_SETTING_ROW
  Count
};

struct SettingInfo {
  const char* name;
  const char* fallback;  // "" unset, "auto" the library decides
  SettingGroup group;
  const char* text;
};

const SettingInfo& setting_info(Setting s);
const char* setting_group_title(SettingGroup g);

// The environment's value, else the table's default. A malformed value throws InvalidArgument
// naming the setting. setting_int of an unset setting without a default, or of "auto", is an
// error: read those with setting_auto_int or setting_str.
std::string setting_str(Setting s);
int64_t setting_int(Setting s);
// nullopt where the value in force is "auto" (or unset with no default).
std::optional<int64_t> setting_auto_int(Setting s);

}  // namespace ringtree

// A cached reader of an integer setting, next to its user: RT_SETTING(ShmRingBytes) declares
// ShmRingBytes(), read from the environment the first time it is called.
#define RT_SETTING(id)                                                             \
  static int64_t id() {                                                            \
    static const int64_t value = ::ringtree::setting_int(::ringtree::Setting::id); \
    return value;                                                                  \
  }
// ... of one that may be "auto": RT_AUTO_SETTING(SpinMicros) declares SpinMicros(), -1 for "auto".
#define RT_AUTO_SETTING(id)                                                                          \
  static int64_t id() {                                                                              \
    static const int64_t value = ::ringtree::setting_auto_int(::ringtree::Setting::id).value_or(-1); \
    return value;                                                                                    \
  }
