#include "runtime/dumps.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include "common/check.h"
#include "common/settings.h"
#include "runtime/private_files.h"

namespace ringtree {

namespace {

RT_SETTING(DumpSignal)

std::mutex registry_mu;
std::map<int, DumpSource>& registry() {
  static auto* sources = new std::map<int, DumpSource>();  // never destroyed: the thread may outlive statics
  return *sources;
}
int next_handle = 1;
int wake_pipe[2] = {-1, -1};

void on_dump_signal(int) {
  const int saved = errno;
  const char byte = 1;
  (void)!write(wake_pipe[1], &byte, 1);
  errno = saved;
}

void dump_thread() {
  for (;;) {
    char byte;
    const ssize_t n = read(wake_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const std::string dir = dump_dir_setting().empty() ? std::string("ringtree-dumps") : dump_dir_setting();
    std::lock_guard<std::mutex> lock(registry_mu);
    for (auto& kv : registry()) {
      try {
        const auto [name, json] = kv.second("signal");
        const std::string path = write_dump_file(dir, name, json);
        std::fprintf(stderr, "ringtree: flight recorder dumped to %s\n", path.c_str());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ringtree: a dump on signal failed: %s\n", e.what());
      }
    }
  }
}

// Once per process, on the first communicator: a handler for the dump signal, unless the
// application already handles that signal itself.
void install_signal_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int sig = static_cast<int>(DumpSignal());
    if (sig <= 0 || sig >= NSIG) return;
    struct sigaction current{};
    if (sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
    if (pipe2(wake_pipe, O_CLOEXEC) != 0) return;
    std::thread(dump_thread).detach();
    struct sigaction sa{};
    sa.sa_handler = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    (void)sigaction(sig, &sa, nullptr);
  });
}

}  // namespace

std::string dump_dir_setting() { return setting_str(Setting::DumpDir); }

std::string write_dump_file(const std::string& dir, const std::string& name, const std::string& json) {
  return write_private_file(dir, name, json);
}

int register_dump_source(DumpSource source) {
  install_signal_once();
  std::lock_guard<std::mutex> lock(registry_mu);
  const int handle = next_handle++;
  registry().emplace(handle, std::move(source));
  return handle;
}

void unregister_dump_source(int handle) {
  std::lock_guard<std::mutex> lock(registry_mu);
  registry().erase(handle);
}

}  // namespace ringtree
