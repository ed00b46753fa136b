#include "common/settings.h"

#include <cstdlib>
#include "common/check.h"

namespace ringtree {

namespace {

constexpr SettingInfo kSettings[] = {
#define RT_SETTING_ROW(id, name, fallback, group, text) {name, fallback, SettingGroup::group, text},
#include "common/settings.def"
#undef RT_SETTING_ROW
};
static_assert(sizeof(kSettings) / sizeof(kSettings[0]) == static_cast<size_t>(Setting::Count),
              "one table row per Setting");

constexpr const char* kGroupTitles[] = {
#define RT_SETTING_GROUP_TITLE(id, title) title,
    RINGTREE_SETTING_GROUPS(RT_SETTING_GROUP_TITLE)
#undef RT_SETTING_GROUP_TITLE
};

// The value in force as text: the environment's (an empty variable counts as unset), else the default.
std::string value_in_force(const SettingInfo& info) {
  const char* v = std::getenv(info.name);
  return (v && *v) ? std::string(v) : std::string(info.fallback);
}

}  // namespace

const SettingInfo& setting_info(Setting s) { return kSettings[static_cast<int>(s)]; }

const char* setting_group_title(SettingGroup g) { return kGroupTitles[static_cast<int>(g)]; }

std::string setting_str(Setting s) { return value_in_force(setting_info(s)); }

std::optional<int64_t> setting_auto_int(Setting s) {
  const SettingInfo& info = setting_info(s);
  const std::string v = value_in_force(info);
  if (v.empty() || v == "auto") return std::nullopt;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 0);
  RT_CHECK(end && *end == '\0', InvalidArgument, "setting ", info.name, "='", v, "' is not an integer",
           std::string(info.fallback) == "auto" ? " or auto" : "");
  return x;
}

int64_t setting_int(Setting s) {
  const std::optional<int64_t> x = setting_auto_int(s);
  RT_CHECK(x.has_value(), InvalidArgument, "setting ", setting_info(s).name, " needs an integer value");
  return *x;
}

}  // namespace ringtree
