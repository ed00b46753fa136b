#include "transport/nccl/nccl_library.h"
#include <dlfcn.h>
#include <link.h>
#include <mutex>
#include <vector>
#include "common/check.h"
#include "common/settings.h"

namespace ringtree {

namespace {

template <typename Fn>
bool resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!fn) missing += str_cat(missing.empty() ? "" : ", ", name);
  return fn != nullptr;
}

// Fills `api` from an open handle; returns "" or what is missing.
std::string bind(void* handle, NcclApi& api) {
  std::string missing;
  resolve(handle, "ncclGetVersion", api.GetVersion, missing);
  resolve(handle, "ncclGetErrorString", api.GetErrorString, missing);
  resolve(handle, "ncclGetUniqueId", api.GetUniqueId, missing);
  resolve(handle, "ncclCommInitRank", api.CommInitRank, missing);
  resolve(handle, "ncclCommDestroy", api.CommDestroy, missing);
  resolve(handle, "ncclCommAbort", api.CommAbort, missing);
  resolve(handle, "ncclCommGetAsyncError", api.CommGetAsyncError, missing);
  resolve(handle, "ncclAllReduce", api.AllReduce, missing);
  resolve(handle, "ncclBroadcast", api.Broadcast, missing);
  resolve(handle, "ncclReduce", api.Reduce, missing);
  resolve(handle, "ncclAllGather", api.AllGather, missing);
  resolve(handle, "ncclReduceScatter", api.ReduceScatter, missing);
  resolve(handle, "ncclSend", api.Send, missing);
  resolve(handle, "ncclRecv", api.Recv, missing);
  resolve(handle, "ncclGroupStart", api.GroupStart, missing);
  resolve(handle, "ncclGroupEnd", api.GroupEnd, missing);
  std::string optional;
  resolve(handle, "ncclGetLastError", api.GetLastError, optional);              // absent before 2.13: fine
  resolve(handle, "ncclCommInitRankConfig", api.CommInitRankConfig, optional);  // before 2.14: no timeout
  if (!missing.empty()) return "it lacks " + missing;
  if (api.GetVersion(&api.version) != kNcclSuccess) return "ncclGetVersion failed";
  // Point-to-point (2.7) is the oldest feature used; older libraries are refused by name.
  if (api.version < 2700) return str_cat("its version ", api.version, " is older than 2.7");
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) api.path = map->l_name;
  return "";
}

struct Loaded {
  NcclApi api{};
  bool ok = false;
  std::string why;
};

Loaded load(const std::string& wheel_hint) {
  Loaded out;
  struct Candidate {
    std::string name;
    int flags;
    const char* label;
  };
  std::vector<Candidate> candidates;
  const std::string forced = setting_str(Setting::NcclLibrary);
  if (!forced.empty()) {
    candidates.push_back({forced, RTLD_NOW | RTLD_LOCAL, "RINGTREE_NCCL_LIBRARY"});
  } else {
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_NOLOAD, "already loaded"});
    if (!wheel_hint.empty()) candidates.push_back({wheel_hint, RTLD_NOW | RTLD_LOCAL, "nvidia-nccl wheel"});
    candidates.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL, "system loader"});
  }
  for (const Candidate& c : candidates) {
    void* handle = dlopen(c.name.c_str(), c.flags);
    if (!handle) {
      if (!(c.flags & RTLD_NOLOAD)) {
        const char* err = dlerror();
        out.why += str_cat(out.why.empty() ? "" : "; ", c.label, " (", c.name, "): ", err ? err : "not found");
      }
      continue;
    }
    NcclApi api{};
    const std::string problem = bind(handle, api);
    if (problem.empty()) {
      out.api = api;
      out.ok = true;
      return out;  // the handle stays open for the life of the process
    }
    out.why += str_cat(out.why.empty() ? "" : "; ", c.label, " (", c.name, "): ", problem);
    dlclose(handle);
  }
  if (out.why.empty()) out.why = "no libnccl.so.2 was found";
  return out;
}

}  // namespace

const NcclApi* nccl_api(const std::string& wheel_hint, std::string* why) {
  // Loaded once: a process keeps the first NCCL it found, as every later call must use the
  // same library its communicators came from.
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [&] { loaded = load(wheel_hint); });
  if (!loaded.ok && why) *why = "NCCL could not be loaded: " + loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

std::string nccl_error_text(const NcclApi& api, NcclResult r, NcclComm comm) {
  std::string text = api.GetErrorString(r);
  const char* last = api.GetLastError ? api.GetLastError(comm) : nullptr;
  if (last && *last) text += str_cat(" (", last, ")");
  return text;
}

}  // namespace ringtree
