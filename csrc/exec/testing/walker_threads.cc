#include "exec/testing/walker_threads.h"
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include "common/check.h"
#include "common/clock.h"
#include "exec/cuda/launch.h"
#include "exec/plan.h"
#include "exec/step_walker.h"
#include "exec/step_walker_host.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/host/reduce.h"

namespace ringtree {

namespace {

// The pre- and post-steps of exec/plan.h on host memory, as the host executor runs them.
struct HostPolicy {
  std::vector<uint8_t>* temp_storage;
  uint8_t* temp(size_t bytes) {
    temp_storage->resize(bytes);
    return temp_storage->data();
  }
  void scale(void* dst, const void* src, uint64_t n, DataType t, double factor) {
    scale_elements(dst, src, n, t, factor);
  }
  void copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  void divide(void* dst, uint64_t n, DataType t, int64_t divisor) { divide_elements(dst, n, t, divisor); }
};

}  // namespace

void walk_on_threads(const ThreadWalkArgs& a) {
  const int P = a.key.nranks;
  RT_CHECK(P >= 1 && static_cast<int>(a.inputs.size()) == P && static_cast<int>(a.outputs.size()) == P, InvalidArgument,
           "walk_on_threads: one input and one output pointer per rank");
  RT_CHECK(a.slots >= 1 && a.slot_bytes >= dtype_size(a.dtype) && a.slot_bytes % dtype_size(a.dtype) == 0,
           InvalidArgument, "walk_on_threads: slots must hold whole elements");
  RT_CHECK(a.channels >= 1 && a.channels <= 64, InvalidArgument, "walk_on_threads: 1 to 64 channels");
  const uint32_t C = a.channels;
  const size_t esz = dtype_size(a.dtype);
  // Mailboxes, per channel. inbox[x][y]: x's slots for chunks from y; posted[x][y] (x's memory):
  // chunks y has posted to x; consumed[x][y] (x's memory): x's chunks y has read.
  const size_t PPC = static_cast<size_t>(P) * P * C;
  std::vector<std::vector<uint8_t>> inbox(PPC);
  std::vector<std::vector<uint64_t>> headers(PPC, std::vector<uint64_t>(2 * a.slots, 0));
  std::vector<uint64_t> posted(PPC, 0), consumed(PPC, 0), stop_words(static_cast<size_t>(P) * P, 0);
  std::vector<uint64_t> calls(static_cast<size_t>(P) * P * 2, 0);  // calls[x][y]: y's call, in x's memory
  for (auto& box : inbox) box.assign(a.slot_bytes * a.slots, 0);
  auto at = [P, C](int x, int y, uint32_t ch) { return (static_cast<size_t>(x) * P + y) * C + ch; };
  std::vector<RankBarrier> barriers(P);
  for (auto& b : barriers) b.parties = C;

  struct RankState {
    CollectiveArgs args;
    CallPlan plan;  // what lower() made of this rank's call, as every executor gets it
    Schedule schedule;
    std::vector<WalkerLane> lanes;
    std::vector<WalkerCounters> counters;
    std::vector<uint8_t> scratch, staged;
    WalkPlan walk;  // channel 0's; the others differ only in `channel`
    std::vector<WalkResult> result;
    std::vector<WalkFault> fault;
    std::vector<std::string> error;
  };
  std::vector<RankState> ranks(P);
  for (int r = 0; r < P; ++r) {
    RankState& st = ranks[r];
    // This rank's call as a user would make it, validated and lowered by the shipping code.
    const CollectiveTraits& traits = collective_traits(a.key.coll);
    const bool is_root = traits.rooted && a.key.root == r;
    const BufferSizes sizes = traits.sizes(a.key.count, P, is_root);
    st.args.coll = a.key.coll;
    st.args.algo = a.key.algo;
    st.args.dtype = a.dtype;
    st.args.op = a.op;
    st.args.premul_factor = a.premul_factor;
    st.args.root = a.key.root;
    st.args.input = {a.inputs[r], sizes.input, false, traits.needs_input(is_root)};
    st.args.output = {a.outputs[r], sizes.output, false, traits.needs_output(is_root)};
    const ValidatedCall v = validate_call(st.args, r, P);
    st.plan = lower(st.args, v, r, P, a.key.algo, a.timeout_s);
    st.plan.key.segment = a.key.segment;  // the test's segment, as given
    st.plan.key.topo = a.key.topo;
    st.schedule = build_schedule(st.plan.key);
    RT_CHECK(walker_can_run(st.schedule), InvalidArgument, "walk_on_threads: algo '", algo_name(a.key.algo),
             "' runs in the shared-memory one-shot slots, not on the step walker");
    st.lanes.resize(static_cast<size_t>(P) * C);
    st.counters.resize(static_cast<size_t>(P) * C);
    st.result.assign(C, WalkResult::Done);
    st.fault.assign(C, WalkFault{});
    st.error.assign(C, "");
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      for (uint32_t ch = 0; ch < C; ++ch) {
        WalkerLane& lane = st.lanes[static_cast<size_t>(q) * C + ch];
        lane.send_slots = inbox[at(q, r, ch)].data();
        lane.send_headers = headers[at(q, r, ch)].data();
        lane.recv_headers = headers[at(r, q, ch)].data();
        lane.send_posted = &posted[at(q, r, ch)];
        lane.send_consumed = &consumed[at(r, q, ch)];
        lane.recv_slots = inbox[at(r, q, ch)].data();
        lane.recv_posted = &posted[at(r, q, ch)];
        lane.recv_consumed = &consumed[at(q, r, ch)];
        lane.peer_stop = &stop_words[static_cast<size_t>(q) * P + r];  // rank r's word in q's memory
        lane.send_call = &calls[(static_cast<size_t>(q) * P + r) * 2];
        lane.recv_call = &calls[(static_cast<size_t>(r) * P + q) * 2];
      }
    }
    HostPolicy device{&st.staged};
    uint8_t* in = run_pre_step(st.plan, device);
    uint8_t* out = static_cast<uint8_t*>(st.plan.output.ptr);
    st.scratch.resize(st.schedule.scratch_elems * esz + 1);
    st.walk.ops = st.schedule.ops.data();
    st.walk.step_end = st.schedule.step_end.data();
    st.walk.num_steps = static_cast<uint32_t>(st.schedule.num_steps());
    st.walk.bases[0] = in;
    st.walk.bases[1] = out;
    st.walk.bases[2] = st.scratch.data();
    st.walk.lanes = st.lanes.data();
    st.walk.nranks = static_cast<uint32_t>(P);
    st.walk.nchannels = C;
    st.walk.stop_words = &stop_words[static_cast<size_t>(r) * P];
    st.walk.rank = static_cast<uint32_t>(r);
    st.walk.counters = st.counters.data();
    st.walk.slot_bytes = a.slot_bytes;
    st.walk.slots = a.slots;
    st.walk.elem_size = static_cast<uint32_t>(esz);
    st.walk.tag = a.tags.empty() ? st.plan.fingerprint(0).tag() : a.tags.at(r);
    for (size_t k = 0; k < st.schedule.num_steps(); ++k)
      RT_CHECK(st.schedule.step_end[k] - st.schedule.step_begin(k) <= kWalkerMaxStepOps, InvalidArgument,
               "walk_on_threads: a step holds more than ", kWalkerMaxStepOps, " ops");
  }
  if (a.device) {
    // One walk kernel per rank, each on a stream of its own; past the deadline the abort word
    // ends them all, as the CUDA IPC executor's watchdog does.
    std::vector<cudaStream_t> streams(P, nullptr);
    std::vector<ChannelBarrier> device_barriers(P, ChannelBarrier{});
    std::vector<WalkStatus> statuses(static_cast<size_t>(P) * C, WalkStatus{});
    uint32_t abort = 0;
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(mu);
      if (!done_cv.wait_for(lock, std::chrono::duration<double>(a.timeout_s), [&] { return done; }))
        __atomic_store_n(&abort, 1u, __ATOMIC_RELEASE);
    });
    std::string launch_error;
    try {
      for (int r = 0; r < P; ++r) {
        RT_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
        for (uint32_t ch = 0; ch < C; ++ch) statuses[static_cast<size_t>(r) * C + ch].result = -1;
        launch_walk(
            WalkLaunch{ranks[r].walk, &abort, &statuses[static_cast<size_t>(r) * C], &device_barriers[r], streams[r]},
            a.dtype, ranks[r].plan.combine);
      }
    } catch (const std::exception& e) {
      launch_error = e.what();
      __atomic_store_n(&abort, 1u, __ATOMIC_RELEASE);  // the ranks already launched stop
    }
    std::string fault;
    for (cudaStream_t s : streams) {
      if (!s) continue;
      const cudaError_t err = cudaStreamSynchronize(s);
      if (err != cudaSuccess && fault.empty()) fault = str_cat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
      (void)cudaStreamDestroy(s);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    done_cv.notify_all();
    watchdog.join();
    RT_CHECK(launch_error.empty(), Error, "walk_on_threads: a launch failed: ", launch_error);
    RT_CHECK(fault.empty(), Error, "walk_on_threads: the walk kernel failed (", fault,
             "); the CUDA stand-in printed why");
    // However a walk ended, the next call on the same barrier must count from zero.
    for (int r = 0; r < P; ++r)
      RT_CHECK(device_barriers[r].arrived == 0 && device_barriers[r].exited == 0, Error, "walk_on_threads: rank ", r,
               "'s channel barrier was left with ", device_barriers[r].arrived, " arrivals and ",
               device_barriers[r].exited, " exits: the next call's step barrier would miscount");
    for (int r = 0; r < P; ++r) {
      for (uint32_t ch = 0; ch < C; ++ch) {
        const WalkStatus& st = statuses[static_cast<size_t>(r) * C + ch];
        ranks[r].result[ch] = static_cast<WalkResult>(st.result);
        ranks[r].fault[ch] = st.fault;
        RT_CHECK(st.result >= 0, Error, "walk_on_threads: rank ", r, " channel ", ch, " left no status");
      }
    }
  } else {
    const Deadline deadline = Deadline::after_seconds(a.timeout_s);
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r) {
      for (uint32_t ch = 0; ch < C; ++ch) {
        threads.emplace_back([&, r, ch] {
          RankState& st = ranks[r];
          try {
            HostMem mem{reduce_fn(a.dtype, st.plan.combine), deadline, &barriers[r]};
            std::vector<uint64_t> progress(kWalkerMaxStepOps);
            WalkPlan walk = st.walk;
            walk.channel = ch;
            st.result[ch] = walk_schedule(walk, mem, progress.data(), &st.fault[ch]);
          } catch (const std::exception& e) {
            st.error[ch] = e.what();
          }
        });
      }
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < P; ++r) {
    for (uint32_t ch = 0; ch < C; ++ch) {
      const WalkFault& f = ranks[r].fault[ch];
      RT_CHECK(ranks[r].result[ch] != WalkResult::Mismatch, CollectiveMismatch, "walk_on_threads: rank ", r,
               " found rank ", f.peer, " in a call with tag ", f.got_tag, " (", f.got_bytes,
               " bytes; 0: its call words) where its own has tag ", f.want_tag, " (", f.want_bytes, " bytes)");
    }
  }
  for (int r = 0; r < P; ++r) {
    for (uint32_t ch = 0; ch < C; ++ch) {
      RT_CHECK(ranks[r].error[ch].empty(), Error, "walk_on_threads: rank ", r, ": ", ranks[r].error[ch]);
      RT_CHECK(ranks[r].result[ch] == WalkResult::Done, Timeout, "walk_on_threads: rank ", r,
               " was still walking after ", a.timeout_s, " s");
    }
  }
  for (RankState& st : ranks) {
    HostPolicy device{&st.staged};
    run_post_step(st.plan, device);
  }
}

}  // namespace ringtree
