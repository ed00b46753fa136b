// A stand-in for NCCL's C ABI, exported by the test module so that RINGTREE_NCCL_LIBRARY can name
// the module's own file: ringtree loads it as it loads libnccl.so.2 (transport/nccl). It does what
// the NCCL executor's set-up depends on, and moves no data:
//
//   ncclGetUniqueId         names a small file in /dev/shm that counts the ranks that arrived
//                           (removed by rank 0's release, or when the process that made it exits)
//   ncclCommInitRank        arrives, then waits until every rank has, as NCCL does: for ever if
//                           one never comes
//   ncclCommInitRankConfig  the same; with config->blocking == 0 it returns ncclInProgress and
//                           ncclCommGetAsyncError reports ncclInProgress until every rank arrived
//   ncclCommAbort/Destroy   free the communicator; aborts are counted (fake_nccl_aborts)
//
// RINGTREE_STANDIN_NCCL_INIT=fail makes this process's init fail at once without arriving (a rank
// failing inside NCCL's set-up). Collectives return ncclInvalidUsage.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "common/settings.h"

namespace {

constexpr int kSuccess = 0, kSystemError = 2, kInvalidArgument = 4, kInvalidUsage = 5, kInProgress = 7;

struct UniqueId {
  char internal[128];
};

struct Comm {
  int nranks = 0, rank = 0;
  std::atomic<uint32_t>* arrived = nullptr;  // mapped from the id's file
  std::string path;
};

struct Config {  // the prefix of ncclConfig_t that this fake reads
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
};

thread_local std::string last_error;
std::atomic<int> aborts{0};

// The files of the ids this process made, removed when it exits: rank 0 removes its file when it
// releases its communicator, but not when it never made one (its init failed, or it was told to).
class IdsMadeHere {
 public:
  void add(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    made_.emplace_back(getpid(), path);
  }
  ~IdsMadeHere() {  // a forked child that exits leaves its parent's ids alone
    for (const auto& [maker, path] : made_)
      if (maker == getpid()) unlink(path.c_str());
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<pid_t, std::string>> made_;
} ids_made_here;

int fail(int code, const std::string& why) {
  last_error = why;
  return code;
}

bool told_to_fail() { return ringtree::setting_str(ringtree::Setting::StandinNcclInit) == "fail"; }

// Opens the id's file, arrives, and returns the communicator (null: error set).
Comm* arrive(int nranks, const UniqueId& id, int rank) {
  char path[sizeof(id.internal) + 1] = {};
  std::memcpy(path, id.internal, sizeof(id.internal));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    last_error = std::string("cannot open ") + path;
    return nullptr;
  }
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    last_error = "cannot map the unique id's file";
    return nullptr;
  }
  auto* comm = new Comm;
  comm->nranks = nranks;
  comm->rank = rank;
  comm->arrived = static_cast<std::atomic<uint32_t>*>(p);
  comm->path = path;
  comm->arrived->fetch_add(1);
  return comm;
}

bool everyone_arrived(const Comm* c) { return c->arrived->load() >= static_cast<uint32_t>(c->nranks); }

void release(Comm* c) {
  munmap(c->arrived, 4096);
  if (c->rank == 0) unlink(c->path.c_str());
  delete c;
}

int init(Comm** out, int nranks, UniqueId id, int rank, bool blocking) {
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) return fail(kInvalidArgument, "bad rank or size");
  if (told_to_fail()) return fail(kSystemError, "RINGTREE_STANDIN_NCCL_INIT=fail");
  Comm* comm = arrive(nranks, id, rank);
  if (!comm) return kSystemError;
  *out = comm;
  if (!blocking) return everyone_arrived(comm) ? kSuccess : kInProgress;
  while (!everyone_arrived(comm)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return kSuccess;
}

}  // namespace

#define FAKE_NCCL extern "C" __attribute__((visibility("default")))

FAKE_NCCL int ncclGetVersion(int* version) {
  *version = 22703;
  return kSuccess;
}

FAKE_NCCL const char* ncclGetErrorString(int r) {
  switch (r) {
    case kSuccess:
      return "no error";
    case kSystemError:
      return "unhandled system error";
    case kInvalidArgument:
      return "invalid argument";
    case kInvalidUsage:
      return "invalid usage";
    case kInProgress:
      return "operation in progress";
    default:
      return "unknown result code";
  }
}

FAKE_NCCL const char* ncclGetLastError(Comm*) { return last_error.c_str(); }

FAKE_NCCL int ncclGetUniqueId(UniqueId* id) {
  // A random part as well as the pid: a file left by a process that was killed must not stop a
  // later one that got its pid.
  static std::atomic<int> serial{0};
  static std::random_device entropy;
  const uint64_t nonce = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  std::memset(id, 0, sizeof(*id));
  std::snprintf(id->internal, sizeof(id->internal), "/dev/shm/ringtree-fake-nccl-%d-%d-%016llx",
                static_cast<int>(getpid()), serial.fetch_add(1), static_cast<unsigned long long>(nonce));
  const int fd = open(id->internal, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return fail(kSystemError, "cannot create the unique id's file");
  const bool sized = ftruncate(fd, 4096) == 0;
  close(fd);
  if (!sized) {
    unlink(id->internal);
    return fail(kSystemError, "cannot size the unique id's file");
  }
  ids_made_here.add(id->internal);
  return kSuccess;
}

FAKE_NCCL int ncclCommInitRank(Comm** comm, int nranks, UniqueId id, int rank) {
  return init(comm, nranks, id, rank, true);
}

FAKE_NCCL int ncclCommInitRankConfig(Comm** comm, int nranks, UniqueId id, int rank, Config* config) {
  return init(comm, nranks, id, rank, !config || config->blocking != 0);
}

FAKE_NCCL int ncclCommGetAsyncError(Comm* comm, int* result) {
  *result = comm && !everyone_arrived(comm) ? kInProgress : kSuccess;
  return kSuccess;
}

FAKE_NCCL int ncclCommAbort(Comm* comm) {
  aborts.fetch_add(1);
  if (comm) release(comm);
  return kSuccess;
}

FAKE_NCCL int ncclCommDestroy(Comm* comm) {
  if (comm) release(comm);
  return kSuccess;
}

FAKE_NCCL int ncclGroupStart() { return kSuccess; }
FAKE_NCCL int ncclGroupEnd() { return kSuccess; }

#define FAKE_NCCL_NO_DATA(name, ...) \
  FAKE_NCCL int name(__VA_ARGS__) { return fail(kInvalidUsage, "the CUDA stand-in's NCCL moves no data"); }
FAKE_NCCL_NO_DATA(ncclAllReduce, const void*, void*, size_t, int, int, Comm*, void*)
FAKE_NCCL_NO_DATA(ncclBroadcast, const void*, void*, size_t, int, int, Comm*, void*)
FAKE_NCCL_NO_DATA(ncclReduce, const void*, void*, size_t, int, int, int, Comm*, void*)
FAKE_NCCL_NO_DATA(ncclAllGather, const void*, void*, size_t, int, Comm*, void*)
FAKE_NCCL_NO_DATA(ncclReduceScatter, const void*, void*, size_t, int, int, Comm*, void*)
FAKE_NCCL_NO_DATA(ncclSend, const void*, size_t, int, int, Comm*, void*)
FAKE_NCCL_NO_DATA(ncclRecv, void*, size_t, int, int, Comm*, void*)

namespace ringtree {
int fake_nccl_aborts() { return aborts.load(); }
}  // namespace ringtree
