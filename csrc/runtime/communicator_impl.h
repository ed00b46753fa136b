// The host communicator: the call order (a queue for async calls, sequence numbers), validation
// and lowering of each call (exec/plan.h), and what follows a failure (abort notices to every
// peer through the control plane). It asks its AlgoChoice (algo_choice.h) which algorithm a call
// runs; the data move in the host executor (exec/host).
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>
#include "bootstrap/control_plane.h"
#include "exec/host/executor.h"
#include "runtime/algo_choice.h"
#include "runtime/flight_recorder.h"
#include "runtime/machine_probe.h"
#include "runtime/messenger.h"
#include "ringtree/communicator.h"

namespace ringtree {

// A call once validated and lowered, with its place in the order.
struct Prepared {
  CollectiveArgs args;
  ValidatedCall validated;
  Algo algo = Algo::Auto;
  double timeout_s = 0;
  uint64_t seq = 0;
  uint64_t recv_seq = 0;        // sendrecv: the receive's p2p sequence number (seq is the send's)
  uint64_t record = 0;          // its flight-recorder id
  bool starts_at_once = false;  // a blocking call with nothing queued before it
  // A broadcast that follows its root's pages (HostExecutor::broadcast_asks_root): the
  // sequence number of the one-byte broadcast that tells every rank the root's answer.
  bool asks_root = false;
  uint64_t ask_seq = 0;
  bool is_ask = false;  // that one-byte broadcast itself
};

class CommunicatorImpl;

// What persistent calls and groups run: calls validated and chosen once, lowered at their first
// run, in the order every rank runs them (runtime/batch.cc). A fused item is one all_reduce over
// `staging`: its members' inputs are packed there before the call and its result unpacked after.
struct BatchItem {
  struct Member {
    Buffer input, output;
    uint64_t offset = 0;  // bytes into the fused call's staging buffer
  };
  Prepared call;
  std::vector<Member> members;  // fused all_reduce: the calls it stands for
  bool lowered = false;
  CallPlan plan;  // lowered at the first run; call.args stays put (items never move after)
};

class Batch : public Request, public std::enable_shared_from_this<Batch> {
 public:
  explicit Batch(std::shared_ptr<CommunicatorImpl> comm) : comm_(std::move(comm)) {}
  std::shared_ptr<Work> start(bool async) override;

  std::shared_ptr<CommunicatorImpl> comm_;
  std::vector<BatchItem> items;
  // A group's collectives as each rank issued them (every field but the sequence number), for
  // the group check; checked before the first run (a persistent group) or every run (a group).
  std::vector<Fingerprint> issued;
  uint64_t issued_hash = 0;
  bool check_pending = false, check_every_run = false;
  uint64_t check_seq = 0;
  // The check's all_gather carries the first item too when that is a small all_reduce (it rides):
  // each rank packs its members after its (count, hash) and reduces the gathered blocks itself,
  // so a checked group of small calls costs one exchange, not two (runtime/batch.cc).
  bool check_rides = false;
  std::vector<uint64_t> check_mine, check_all;  // this rank's block, every rank's blocks
  // The check's all_gather over them, prepared and lowered at the first check (the same call at
  // every run of a group but for its sequence number).
  bool check_lowered = false;
  Prepared check_call;
  CallPlan check_plan;
  AlignedBuffer staging;
  std::atomic<bool> running{false};
};

class CommunicatorImpl : public Communicator, public std::enable_shared_from_this<CommunicatorImpl> {
 public:
  CommunicatorImpl(int rank, int size, const UniqueId& uid, double timeout_s);
  ~CommunicatorImpl() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  double default_timeout() const override { return default_timeout_; }
  std::shared_ptr<Work> run(const CollectiveArgs& args, bool async) override;
  std::shared_ptr<Request> persistent(const CollectiveArgs& args) override;
  void group_start() override;
  std::shared_ptr<Work> group_end(bool async) override;
  std::shared_ptr<Request> group_end_persistent() override;
  std::shared_ptr<Work> run_coalesced(const CollectiveArgs& common, const CallBuffers* buffers, size_t n,
                                      bool async) override;
  void group_discard() override;
  bool in_group() const override;
  ValidatedCall validate(const CollectiveArgs& args) const override { return validate_call(args, rank_, size_); }
  Algo choose_algo(Collective coll, Algo requested, uint64_t bytes, DataType dtype, ReduceOp op = ReduceOp::Sum,
                   bool deterministic = false) const override {
    return choice_.choose(coll, requested, bytes, dtype, op, deterministic);
  }
  std::vector<AlgoEstimate> estimate(Collective coll, uint64_t bytes, DataType dtype,
                                     bool deterministic = false) const override {
    return choice_.estimate(coll, bytes, dtype, deterministic);
  }
  void set_choice_hook(std::shared_ptr<ChoiceHook> hook) override {
    choice_.set_hook(std::move(hook));  // forgets the choices made before
    std::lock_guard<std::mutex> lock(group_cache_mu_);
    cached_group_.reset();  // and so does the kept group, which holds some of them
    coalesced_kept_ = false;
  }
  CommStatus status() const override;
  std::string address() const override;
  std::shared_ptr<MessageWork> isend(const void* ptr, uint64_t bytes, int dst, int64_t tag) override {
    return messenger_.isend(ptr, bytes, dst, tag);
  }
  std::shared_ptr<MessageWork> irecv(void* ptr, uint64_t capacity_bytes, bool readonly, int src, int64_t tag) override {
    return messenger_.irecv(ptr, capacity_bytes, readonly, src, tag);
  }
  MessageStatus probe(int src, int64_t tag, double timeout_s) override { return messenger_.probe(src, tag, timeout_s); }
  bool iprobe(int src, int64_t tag, MessageStatus& found) override { return messenger_.iprobe(src, tag, found); }
  void close() override;
  bool is_aborted() const override { return aborted_.load(); }
  void abort(const std::string& why) override;
  std::string dump_json(const std::string& reason) const override;
  std::string id() const override;
  UniqueId child_unique_id(const std::string& ip, uint16_t port, const std::array<uint8_t, 16>& nonce) const override {
    return uid_.child(ip, port, nonce);
  }
  void set_label(int64_t label) override { label_.store(label, std::memory_order_relaxed); }
  void set_clock_offset(int64_t offset_ns, int64_t error_ns) override {
    clock_offset_ns_.store(offset_ns);
    clock_error_ns_.store(error_ns);
  }

 private:
  // Rank 0's machine figures, adopted by every rank, and the algorithm choice built from them.
  void setup_choice(Bootstrap& boot);
  Prepared prepare(const CollectiveArgs& args) const;
  // plan: the call's plan when it has one already (a batch's item); else it is lowered here.
  void execute(Prepared& p, const CallPlan* plan = nullptr);
  // Its place in the call order (sequence numbers) and its recorder entry; holds queue_mu_.
  void order_call(Prepared& p);
  friend class Batch;
  // Batches (runtime/batch.cc): the calls as a batch runs them; its place in the order (sequence
  // numbers, recorder entries) under queue_mu_; its run, holding exec_mu_.
  // Validates every call (a bad one throws InvalidArgument naming it; with `group`, its place in
  // the group), fuses and orders them, and chooses each item's algorithm.
  std::shared_ptr<Batch> make_batch(const std::vector<CollectiveArgs>& calls, bool group);
  // The batch of a group: the last group's again when this one issued the same calls on the same
  // buffers (a training step's group, step after step), else a new one, kept for the next.
  std::shared_ptr<Batch> group_batch(std::vector<CollectiveArgs>& calls,
                                     const std::shared_ptr<const std::vector<CollectiveArgs>>& matched);
  // run() outside a group, and in one: a call that repeats the kept group's is counted, others copied.
  std::shared_ptr<Work> run_now(const CollectiveArgs& args, bool async);
  std::shared_ptr<Work> collect_group_call(const CollectiveArgs& args, bool async);
  std::shared_ptr<Work> group_async_work();  // the open group's one Work
  void take_group_calls(std::vector<CollectiveArgs>& calls,
                        std::shared_ptr<const std::vector<CollectiveArgs>>& matched);
  void order_batch(Batch& b);
  void run_batch(Batch& b);
  // Returns whether the check also ran the first item (it rode: Batch::check_rides).
  bool check_group(Batch& b);
  std::shared_ptr<Work> start_batch(const std::shared_ptr<Batch>& b, bool async, std::shared_ptr<Work> work);
  // A failure found outside the executor, alike on every rank: the communicator is aborted.
  void fail_here(const Error& e);
  // Records, reports to every peer and raises a failed call's error.
  [[noreturn]] void fail(Prepared& p, const Error& e);
  void ask_root_pages(Prepared& p);
  static bool moves_nothing(const Prepared& p);
  void worker_loop();
  // ringtree-<id>-rank<r>.json, the name every dump of this rank's record takes.
  std::string dump_file_name() const;
  // With RINGTREE_DUMP_DIR set (after a failure, at exit): this rank's record there, for the
  // analyzer; a failing write is reported, never raised.
  void dump_to_setting(const std::string& reason) const;

  int rank_, size_;
  UniqueId uid_;
  double default_timeout_;
  Mesh mesh_;
  ControlPlane ctrl_;
  HostExecutor exec_;
  Messenger messenger_;  // tagged messages, beside the call order
  Topology topo_;        // which ranks share a host (shared-memory pairs), from the mesh
  AlgoChoice choice_;    // from rank 0's figures, so every rank chooses alike

  // Call order state (guarded by queue_mu_).
  uint64_t next_seq_ = 0;
  std::vector<uint64_t> p2p_send_seq_, p2p_recv_seq_;
  Fingerprint skipped_;  // the last count-0 call, which ran no traffic
  bool any_skipped_ = false;
  uint64_t ran_through_ = 0;  // 1 + the last collective that ran (guarded by exec_mu_)
  std::atomic<bool> aborted_{false};
  std::atomic<bool> closed_{false};
  std::string abort_reason_;
  std::string wait_policy_;  // how this rank waits, and the counts behind it (status())

  std::mutex exec_mu_;  // one call at a time in the executor

  FlightRecorder recorder_;
  std::atomic<int64_t> label_{-1};
  std::atomic<int64_t> clock_offset_ns_{0}, clock_error_ns_{0};
  int dump_source_ = 0;  // registration for dumps on a signal

  // The open group: nesting depth (changed by the issuing thread only, read without a lock on
  // every call), its calls as issued (appended by that thread alone, without a lock; taken under
  // queue_mu_ by group_end) and the Work its async calls got.
  std::atomic<int> group_depth_{0};
  std::thread::id group_owner_;  // the thread that opened the group (set before depth turns 1)
  std::vector<CollectiveArgs> group_args_;
  size_t last_group_calls_ = 0;  // the capacity the next group starts with
  // While the open group's calls repeat the kept group's (a training step's group, step after
  // step), run() only counts them (group_matched_), copying nothing; the first call that differs
  // copies the matched ones into group_args_ and collecting goes on there. Owner thread only.
  std::shared_ptr<const std::vector<CollectiveArgs>> group_template_;
  size_t group_matched_ = 0;
  bool group_matching_ = false;
  std::shared_ptr<Work> group_work_;
  std::mutex group_cache_mu_;  // two threads may end groups one after the other, not together
  std::shared_ptr<const std::vector<CollectiveArgs>> cached_group_calls_;  // replaced, never changed
  std::shared_ptr<Batch> cached_group_;  // its comm_ is reset: it must not keep this alive
  // What the last run_coalesced() was called with, while cached_group_ is still the batch it
  // made (coalesced_kept_, cleared whenever cached_group_ changes): a repeat is compared buffer
  // by buffer and runs that batch, without collecting its calls one by one.
  CollectiveArgs coalesced_common_;
  std::vector<CallBuffers> coalesced_buffers_;
  bool coalesced_kept_ = false;
  std::shared_ptr<Work> run_group_batch(const std::shared_ptr<Batch>& b, bool async, std::shared_ptr<Work> work);

  // Async queue.
  struct Job {
    Prepared prepared;
    std::shared_ptr<Work> work;
    std::shared_ptr<Batch> batch;  // non-null: run this batch instead of `prepared`
  };
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Job> queue_;
  bool worker_busy_ = false;
  bool stop_worker_ = false;
  std::thread worker_;
};

}  // namespace ringtree
