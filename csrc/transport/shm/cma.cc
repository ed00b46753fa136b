#include "transport/shm/cma.h"

#include <sys/uio.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include "common/check.h"

namespace ringtree {

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
