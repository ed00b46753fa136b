#include "transport/shm/cma.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include "common/check.h"

namespace ringtree {

namespace {
// The kernel's PAGEMAP_SCAN interface (linux/fs.h from 6.7), spelled out for older headers.
struct PageRegion {
  uint64_t start, end, categories;
};
struct PageScanArg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
  uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
constexpr unsigned long kPageMapScan = _IOWR('f', 16, PageScanArg);
constexpr uint64_t kPageIsHuge = 1u << 6;

// This thread's /proc/self/pagemap, reopened after a fork (the file names the process that
// opened it), closed when the thread ends.
struct PageMap {
  int fd = -1;
  pid_t pid = 0;
  bool unsupported = false;
  ~PageMap() {
    if (fd >= 0) close(fd);
  }
  int get() {
    const pid_t now = getpid();
    if (fd >= 0 && pid == now) return fd;
    if (fd >= 0) close(fd);
    fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    pid = now;
    unsupported = fd < 0;
    return fd;
  }
};
thread_local PageMap page_map;
}  // namespace

std::optional<bool> cma_source_on_huge_pages(const void* p, uint64_t bytes) {
  if (bytes == 0) return true;
  if (page_map.unsupported) return std::nullopt;
  const int fd = page_map.get();
  if (fd < 0) return std::nullopt;
  static const uint64_t small_page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));  // the scan's unit
  const uint64_t begin = reinterpret_cast<uint64_t>(p) & ~(small_page - 1);
  const uint64_t end = (reinterpret_cast<uint64_t>(p) + bytes + small_page - 1) & ~(small_page - 1);
  const uint64_t allowed = bytes / 2 / small_page;  // small pages tolerated
  PageRegion regions[8];
  PageScanArg arg{};
  arg.size = sizeof(arg);
  arg.start = begin;
  arg.end = end;
  arg.vec = reinterpret_cast<uint64_t>(regions);
  arg.vec_len = 8;
  arg.max_pages = allowed + 1;                                                // the scan stops once the answer is no
  arg.category_inverted = arg.category_mask = arg.return_mask = kPageIsHuge;  // pages NOT huge
  const long found = ioctl(fd, kPageMapScan, &arg);
  if (found < 0) {
    page_map.unsupported = errno == ENOTTY || errno == EINVAL || errno == EPERM;  // an older kernel
    return std::nullopt;
  }
  uint64_t small = 0;
  for (long i = 0; i < found; ++i) small += (regions[i].end - regions[i].start) / small_page;
  if (found == 8 && arg.walk_end < end) return false;  // more scattered small pages than regions
  return small <= allowed;
}

bool transparent_huge_pages_possible() {
  // "always [madvise] never": the bracketed word is the mode.
  FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");
  if (!f) return false;
  char line[128] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  return read && std::strstr(line, "[never]") == nullptr;
}

int32_t cma_probe(pid_t pid, uint64_t addr, uint64_t expected) {
  uint64_t word = ~expected;
  iovec local{&word, sizeof(word)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(word)};
  const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n < 0) return errno;
  // A short read or another value: the pid names another process (a pid namespace apart).
  return n == static_cast<ssize_t>(sizeof(word)) && word == expected ? 0 : kCmaVerdictMismatch;
}

uint64_t cma_read(pid_t pid, void* local, uint64_t remote, uint64_t bytes, int peer) {
  iovec l{local, bytes};
  iovec r{reinterpret_cast<void*>(remote), bytes};
  for (;;) {
    const ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n > 0) return static_cast<uint64_t>(n);
    const int e = n < 0 ? errno : EFAULT;
    if (e == EINTR) continue;
    if (e == ESRCH)
      RT_THROW(PeerFailure, "rank ", peer,
               " exited while this rank read its buffer (process_vm_readv: ", std::strerror(e), ")");
    RT_THROW(Error, "single-copy read of ", bytes, " bytes from rank ", peer,
             " failed: process_vm_readv: ", std::strerror(e));
  }
}

std::string cma_verdict_text(int32_t verdict) {
  switch (verdict) {
    case 0:
      return "ok";
    case kCmaVerdictPending:
      return "not probed";
    case kCmaVerdictOff:
      return "RINGTREE_CMA=0";
    case kCmaVerdictMismatch:
      return "the probe read another process's memory (different pid namespaces?)";
    case kCmaVerdictSimulated:
      return "probe failure simulated by the test hook RINGTREE_TEST_CMA_PROBE_FAIL";
    default:
      break;
  }
  std::string text = str_cat("process_vm_readv: ", std::strerror(verdict));
  if (verdict == EPERM) {
    int scope = -1;
    if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
      if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
      std::fclose(f);
    }
    text += scope >= 0 ? str_cat(" (kernel.yama.ptrace_scope is ", scope, ")")
                       : std::string(" (a seccomp profile or capability forbids it)");
  }
  return text;
}

}  // namespace ringtree
