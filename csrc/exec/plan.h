// One lowering for every executor. A call is validated once (validate_call) and lowered once
// (lower) into a CallPlan: plain data that says which schedule to walk, on which buffers, with
// which step before the walk (none, scale the input for premul_sum, copy the input aside for an
// in-place all_to_all) and which after it (divide for avg). Every executor — the host progress
// engine, the CUDA thread ranks, the CUDA IPC kernel, NCCL, and the host-thread walker the tests
// run — executes a plan through run_plan() and a small device policy:
//
//   uint8_t* temp(size_t bytes)                          memory for the pre-step's result
//   void scale(void* dst, const void* src, uint64_t n, DataType, double factor)
//   void copy(void* dst, const void* src, size_t bytes)
//   void walk(const CallPlan&, uint8_t* in, uint8_t* out)   the schedule over this device's transport
//   void divide(void* dst, uint64_t n, DataType, int64_t divisor)
//
// so premul_sum, in-place all_to_all and avg mean the same thing on every device, and a later
// change (folding the pre/post steps into the reduce operator, as NCCL's FuncPreMulSum does)
// happens here once.
#pragma once
#include <cstdint>
#include "algorithms/schedule.h"
#include "common/collective.h"
#include "ringtree/communicator.h"

namespace ringtree {

enum class PreStep : uint8_t {
  None,
  ScaleInput,  // premul_sum: the schedule reduces factor x input, scaled once into temp
  CopyInput,   // in-place all_to_all(_v): pairwise exchange overwrites blocks not yet sent
};
enum class PostStep : uint8_t {
  None,
  DivideOutput,  // avg: the schedule sums; the ranks that own a result divide it by P
};

// What every message of a call carries so that ranks that made different calls find out:
// collective (p2p calls all as send), dtype, op, root, algorithm, sequence number, count and, for
// reductions, deterministic mode.
struct Fingerprint {
  static constexpr uint8_t kNoOp = 0xff;
  Collective coll = Collective::Barrier;
  DataType dtype = DataType::Int8;
  uint8_t op = kNoOp;  // a ReduceOp for reductions
  Algo algo = Algo::Auto;
  int32_t root = -1;  // rooted collectives only
  uint64_t seq = 0;
  uint64_t count = 0;          // ScheduleKey::count
  bool deterministic = false;  // reductions: deterministic mode, which every rank must share
  bool operator==(const Fingerprint& o) const {
    return coll == o.coll && dtype == o.dtype && op == o.op && algo == o.algo && root == o.root && seq == o.seq &&
           count == o.count && deterministic == o.deterministic;
  }
  // A 64-bit hash of all of it, never 0 (the value of a mailbox header nobody wrote).
  uint64_t tag() const;
};

// "all_reduce #3 (count=..., dtype=..., op=..., algo=...)", for errors.
std::string describe(const Fingerprint& fp);

struct CallPlan {
  ScheduleKey key;  // rank, concrete algorithm, count, root, segment, peer
  DataType dtype = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;       // as the user asked (fingerprinted)
  ReduceOp combine = ReduceOp::Sum;  // what the schedule reduces with (avg, premul_sum: sum)
  double premul_factor = 1.0;
  bool deterministic = false;  // deterministic_mode() of the call (fingerprinted)
  Buffer input, output;        // as the schedule sees them: broadcast's one buffer is both
  PreStep pre = PreStep::None;
  uint64_t pre_elems = 0;  // elements the pre-step writes into temp (the whole input)
  PostStep post = PostStep::None;
  uint64_t post_elems = 0;  // elements the post-step divides (the whole output)
  int64_t divisor = 1;
  double timeout_s = 0;
  // sendrecv and all_to_all_v: per-call sizes that are not part of the key.
  const CollectiveArgs* args = nullptr;

  size_t elem_size() const { return dtype_size(dtype); }
  size_t temp_bytes() const { return pre == PreStep::None ? 0 : pre_elems * elem_size(); }
  // The fingerprint of this plan as call number `seq`.
  Fingerprint fingerprint(uint64_t seq) const;
};

// RINGTREE_DETERMINISTIC=1: deterministic mode for every call of this process.
bool deterministic_setting();
// Deterministic mode: the call asked for it, or the setting.
bool deterministic_mode(const CollectiveArgs& a);
// Whether the call must take a rank-order schedule: deterministic mode, a reduction, and a
// floating-point dtype (integer sum, prod, min and max give the same bits in any order).
bool needs_rank_order(const CollectiveArgs& a);

// The checks every call gets before any traffic, on the rank that made it: throws
// InvalidArgument (the communicator stays usable) or returns the buffers as the collective uses
// them and the schedule count.
ValidatedCall validate_call(const CollectiveArgs& a, int rank, int nranks);

// A validated call with its concrete algorithm (never Auto) as a plan. timeout_s: the call's
// own or the communicator's default; segment_bytes: 0 for the RINGTREE_TREE_SEGMENT_BYTES setting;
// topo: the hosts, which the hierarchical algorithms' schedules need (ScheduleKey::topo).
// stage_in_schedule: the executor completes a send of a schedule with scratch only once the
// receiver has the data (the host executor); an in-place direct all_to_all then stages only the
// blocks it overwrites before sending them (ScheduleKey::same_buffer), not the whole input.
CallPlan lower(const CollectiveArgs& a, const ValidatedCall& v, int rank, int nranks, Algo algo, double timeout_s,
               uint64_t segment_bytes = 0, const Topology* topo = nullptr, bool stage_in_schedule = false);

// The plan's pre-step on `dev`: returns the input the schedule reads (temp, or the user's).
template <typename Device>
uint8_t* run_pre_step(const CallPlan& p, Device& dev) {
  auto* in = static_cast<uint8_t*>(p.input.ptr);
  switch (p.pre) {
    case PreStep::ScaleInput: {
      uint8_t* scaled = dev.temp(p.temp_bytes());
      dev.scale(scaled, in, p.pre_elems, p.dtype, p.premul_factor);
      return scaled;
    }
    case PreStep::CopyInput: {
      uint8_t* copy = dev.temp(p.temp_bytes());
      dev.copy(copy, in, p.temp_bytes());
      return copy;
    }
    default:
      return in;
  }
}

template <typename Device>
void run_post_step(const CallPlan& p, Device& dev) {
  if (p.post == PostStep::DivideOutput && p.post_elems) dev.divide(p.output.ptr, p.post_elems, p.dtype, p.divisor);
}

// Pre-step, walk, post-step: a whole call on one device.
template <typename Device>
void run_plan(const CallPlan& p, Device& dev) {
  uint8_t* in = run_pre_step(p, dev);
  dev.walk(p, in, static_cast<uint8_t*>(p.output.ptr));
  run_post_step(p, dev);
}

}  // namespace ringtree
