// NCCL, loaded at run time: ringtree builds and runs without it, and uses whichever
// libnccl.so.2 the machine has (the nvidia-nccl wheel, torch's, the system's) when asked for
// algo="nccl". The declarations below are NCCL's stable C ABI (nccl.h since 2.7), written out
// so that nccl.h is not needed at build time either.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringtree {

struct NcclUniqueId {
  char internal[128];
};
using NcclComm = struct NcclCommOpaque*;
using NcclStream = void*;  // cudaStream_t
using NcclResult = int;    // ncclResult_t: 0 is ncclSuccess, 7 is ncclInProgress
constexpr NcclResult kNcclSuccess = 0;
constexpr NcclResult kNcclInProgress = 7;

// ncclDataType_t and ncclRedOp_t values.
// The float8 types exist from NCCL 2.24 (kNcclFloat8Version).
enum NcclDataType : int {
  kNcclInt8 = 0,
  kNcclUint8 = 1,
  kNcclInt32 = 2,
  kNcclUint32 = 3,
  kNcclInt64 = 4,
  kNcclUint64 = 5,
  kNcclFloat16 = 6,
  kNcclFloat32 = 7,
  kNcclFloat64 = 8,
  kNcclBfloat16 = 9,
  kNcclFloat8e4m3 = 10,
  kNcclFloat8e5m2 = 11
};
constexpr int kNcclFloat8Version = 22400;
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };

// The prefix of ncclConfig_t that NCCL 2.14 defined (nccl.h's NCCL_CONFIG_INITIALIZER): NCCL reads
// `size` and `version` and fills what a newer library adds with its defaults.
struct NcclConfig {
  size_t size = sizeof(NcclConfig);
  unsigned int magic = 0xcafebeef;
  unsigned int version = 21400;  // NCCL_VERSION(2, 14, 0)
  int blocking = INT32_MIN;      // NCCL_CONFIG_UNDEF_INT: NCCL's default
  int cga_cluster_size = INT32_MIN;
  int min_ctas = INT32_MIN;
  int max_ctas = INT32_MIN;
  const char* net_name = nullptr;
};

struct NcclApi {
  NcclResult (*GetVersion)(int*);
  const char* (*GetErrorString)(NcclResult);
  const char* (*GetLastError)(NcclComm);  // may be null (NCCL < 2.13)
  NcclResult (*GetUniqueId)(NcclUniqueId*);
  NcclResult (*CommInitRank)(NcclComm*, int, NcclUniqueId, int);
  NcclResult (*CommInitRankConfig)(NcclComm*, int, NcclUniqueId, int, NcclConfig*);  // null before 2.14
  NcclResult (*CommDestroy)(NcclComm);
  NcclResult (*CommAbort)(NcclComm);
  NcclResult (*CommGetAsyncError)(NcclComm, NcclResult*);
  NcclResult (*AllReduce)(const void*, void*, size_t, int, int, NcclComm, NcclStream);
  NcclResult (*Broadcast)(const void*, void*, size_t, int, int, NcclComm, NcclStream);
  NcclResult (*Reduce)(const void*, void*, size_t, int, int, int, NcclComm, NcclStream);
  NcclResult (*AllGather)(const void*, void*, size_t, int, NcclComm, NcclStream);
  NcclResult (*ReduceScatter)(const void*, void*, size_t, int, int, NcclComm, NcclStream);
  NcclResult (*Send)(const void*, size_t, int, int, NcclComm, NcclStream);
  NcclResult (*Recv)(void*, size_t, int, int, NcclComm, NcclStream);
  NcclResult (*GroupStart)();
  NcclResult (*GroupEnd)();
  std::string path;  // the file it came from (as dlinfo reports it)
  int version = 0;   // NCCL_VERSION_CODE: major*10000 + minor*100 + patch
};

// Loads NCCL once per process and returns its entry points, or nullptr; *why says what was
// tried and why it failed. Looked for, in order: RINGTREE_NCCL_LIBRARY, a libnccl.so.2
// already in the process (torch's), `wheel_hint` (the nvidia-nccl wheel's, found by the
// Python layer), then the system loader's libnccl.so.2. Thread-safe.
const NcclApi* nccl_api(const std::string& wheel_hint, std::string* why);

// "ncclInvalidUsage: <NCCL's last error>" for a failed call.
std::string nccl_error_text(const NcclApi& api, NcclResult r, NcclComm comm = nullptr);

}  // namespace ringtree
