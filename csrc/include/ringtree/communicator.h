// The communicator: the one object users hold. Collectives are validated on the calling rank
// before any traffic (InvalidArgument leaves the communicator usable), then run in call order
// on this rank, inline when blocking or on the communicator's worker thread when async.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>
#include "ringtree/errors.h"
#include "ringtree/types.h"
#include "ringtree/unique_id.h"

namespace ringtree {

struct Buffer {
  void* ptr = nullptr;
  uint64_t count = 0;  // elements
  bool readonly = false;
  bool present = false;
};

// Opened once a call's buffers hold its input. A call whose data are still being produced when
// it is issued (device data on their way to host staging buffers) takes its place in the
// communicator's order at once, and its traffic starts when the gate opens.
class Gate {
 public:
  // `on_done` runs on the thread that ran the call, once it has finished or failed.
  explicit Gate(std::function<void()> on_done = nullptr) : on_done_(std::move(on_done)) {}
  void open();
  // The input will never come (the producer failed): the call fails with `why`, on every rank.
  void fail(const std::string& why);
  // False if the gate is still closed after timeout_s; throws Error after fail().
  bool wait_open(double timeout_s);
  // Runs on_done; a failure there is reported on stderr, never allowed to end the caller.
  void done() noexcept;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::string failure_;
  std::function<void()> on_done_;
};

struct CollectiveArgs {
  Collective coll = Collective::AllReduce;
  DataType dtype = DataType::Float32;
  Buffer input, output;  // broadcast: both are the same buffer
  ReduceOp op = ReduceOp::Sum;
  double premul_factor = 1.0;
  int root = 0;
  int peer = -1;       // send, recv; sendrecv: the destination
  int recv_peer = -1;  // sendrecv: the source
  Algo algo = Algo::Auto;
  // Deterministic mode for this call (RINGTREE_DETERMINISTIC turns it on for every call):
  // floating-point reductions reduce in rank order, with the same bits on any layout.
  bool deterministic = false;
  double timeout_s = 0;  // <= 0: the communicator's default
  // all_to_all_v: elements this rank sends to / receives from each rank; blocks are
  // contiguous in rank order (displacements are the prefix sums).
  std::vector<uint64_t> send_counts, recv_counts;
  // Non-null: run only once this gate opens (always async; see Gate).
  std::shared_ptr<Gate> ready;
};

// A call as validate() sees it: its buffers as the collective uses them (broadcast: the one
// buffer is input and output; a root reducing in place: the output is the input) and its
// schedule count (elements: the whole buffer for all_reduce, broadcast and reduce, one rank's
// block for the others).
struct ValidatedCall {
  Buffer input, output;
  uint64_t count = 0;
};

class Work {
 public:
  // Waits up to timeout_s (< 0: without limit). Returns false if still running then; rethrows
  // the collective's error.
  bool wait(double timeout_s);
  bool is_completed() const;
  void finish(std::exception_ptr error);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// A call, or a group of calls, validated, chosen and planned once, that start() runs again on the
// same buffers with only the data moving (MPI's persistent collectives; a group's calls once
// group_end_persistent() has collected them). Every run is fingerprinted and ordered as a call is.
class Request {
 public:
  virtual ~Request() = default;
  // Blocking (async=false): returns nullptr once done, or throws. Async: returns a Work at once.
  // Throws InvalidArgument while an earlier start of this request is still running.
  virtual std::shared_ptr<Work> start(bool async) = 0;
};

// Tagged point-to-point messages (runtime/messenger.h): outside the call order, matched by
// source and tag as MPI does.
constexpr int kAnySource = -1;
constexpr int64_t kAnyTag = -1;
// Tags from here up belong to ringtree itself (shrink's agreement): users cannot send them and
// kAnyTag never matches them, so a user's pending any-tag receive cannot take them.
constexpr int64_t kFirstReservedTag = int64_t{1} << 62;
// The end of what ringtree's own protocols use (shrink: 2^32 tags per attempt, at most 2^20
// attempts). A message tagged outside [0, kReservedTagEnd) no send could have produced: its
// receiver drops the sender as faulty instead of matching it.
constexpr int64_t kReservedTagEnd = kFirstReservedTag + (int64_t{1} << 52);

// What a receive got, or what a probe found: sender, tag and payload size in bytes.
struct MessageStatus {
  int source = -1;
  int64_t tag = -1;
  uint64_t bytes = 0;
};

// One isend or irecv in flight.
class MessageWork {
 public:
  virtual ~MessageWork() = default;
  // Waits up to timeout_s (<= 0: the communicator's timeout) and rethrows the message's error.
  // Past the timeout it cancels the message (a receive then never touches its buffer again)
  // and throws Timeout.
  virtual void wait(double timeout_s) = 0;
  virtual bool is_completed() const = 0;
  // Stops the message unless it already completed: true when it was cancelled (its wait()
  // then throws Aborted). A send already partly on the wire still finishes, from a copy.
  virtual bool cancel() = 0;
  // A receive's sender, tag and byte count once it completed; a send's own.
  virtual MessageStatus status() const = 0;
};

// One candidate algorithm's predicted time for a call, and the formula behind it.
struct AlgoEstimate {
  Algo algo;
  double seconds;
  std::string formula;
};

// One call as a ChoiceHook sees it: every candidate the cost model weighed, in its order, with
// its prediction, and the model's own pick.
struct ChoiceRequest {
  Collective coll = Collective::AllReduce;
  uint64_t bytes = 0;  // one rank's block (the whole buffer for all_reduce, broadcast, reduce)
  DataType dtype = DataType::Float32;
  int nranks = 1;
  int nhosts = 1;
  std::vector<AlgoEstimate> candidates;
  Algo model_choice = Algo::Auto;
};

// A replacement for the last step of algo="auto" (runtime/algo_choice.h, rule 6: the cheapest
// prediction), as NCCL's tuner plugins are for NCCL. It must answer from the request alone, the
// same on every rank (a call's fingerprint carries its algorithm, so ranks that disagree fail
// with CollectiveMismatch, never hang); its answers are remembered as the model's are. It runs
// on the thread that issues the call, before any traffic; an error it throws fails that call.
class ChoiceHook {
 public:
  virtual ~ChoiceHook() = default;
  virtual Algo choose(const ChoiceRequest& request) = 0;
};

// What a communicator found at set-up and has counted since, in one snapshot (read it between
// calls: the counters move during them).
struct CommStatus {
  std::vector<std::string> transports;  // per rank: "self", "shm" or "tcp"
  std::string hosts;                    // the hosts as the data path sees them: "1 host: {0,1}"
  std::string wait_policy;              // how this rank waits, and the counts that decided it
  std::string single_copy;              // "on: ..." or "off: <reason>" (process_vm_readv)
  std::string numa;                     // this rank's node and where its shared memory was placed
  std::vector<int> numa_nodes;          // each rank's node as seen from here (-1: not known here)
  std::string shm_stores;               // which stores each shared-memory writer uses, and why
  std::string cost_source;  // the cost model's figures: measured, cached, "measured (busy)" (not cached), defaults
  std::vector<std::pair<std::string, double>> machine;  // those figures (call_us, hop_us, ...)
  bool algo_hook = false;                               // a ChoiceHook makes auto's last decision
  uint64_t shared_cpu_waits = 0;      // waits that skipped spinning: a peer they needed was on this CPU
  uint64_t single_copy_messages = 0;  // messages this rank received single-copy
  uint64_t streamed_pieces = 0;       // ring pieces this rank wrote with streaming stores
  // Broadcasts of [first, second) bytes ask their root whether it holds the buffer mostly on huge
  // pages, and run the flat tree if so (ranks outnumber cores); {0, 0}: none.
  std::pair<uint64_t, uint64_t> broadcast_asks_root{0, 0};
};

class Communicator {
 public:
  // timeout_s bounds the setup and is the default for every collective.
  static std::shared_ptr<Communicator> create(int rank, int size, const UniqueId& uid, double timeout_s);
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual double default_timeout() const = 0;
  // Blocking (async=false): returns nullptr once done, or throws. Async: returns a Work at once.
  virtual std::shared_ptr<Work> run(const CollectiveArgs& args, bool async) = 0;
  // A persistent call: the checks, the choice and the plan of run(args) now (InvalidArgument
  // before any traffic), and a Request whose start() runs it. Gated calls cannot be persistent.
  virtual std::shared_ptr<Request> persistent(const CollectiveArgs& args) = 0;
  // Grouped calls (NCCL's ncclGroupStart/End). Between group_start() and group_end(), run()
  // collects each call as issued: a blocking call returns at once, an async one returns the
  // group's Work. group_end() validates them all first (a bad one throws InvalidArgument naming
  // its place in the group, before any traffic, and the group is dropped), then runs them
  // as one operation: one check that every rank's group holds the same collectives (a mismatch
  // names the call within the group, on every rank), small all_reduces of one dtype and op fused
  // into one call over a staging buffer, the other collectives in issue order, then the sends and
  // receives, each send paired with a receive so that an exchange cannot deadlock. Groups nest;
  // the outermost group_end() runs them. A group collects the calls of the thread that opened
  // it (other threads' calls run as usual); start, end and discard it from that thread.
  virtual void group_start() = 0;
  // Blocking: returns nullptr once every call of the group is done, or throws. Async: the Work.
  virtual std::shared_ptr<Work> group_end(bool async) = 0;
  // Ends the (outermost) group without running it: a Request that runs it at each start().
  virtual std::shared_ptr<Request> group_end_persistent() = 0;
  // Drops the calls collected so far and leaves the group (after an error inside it): nothing was
  // sent, and the communicator stays usable. A Work the group handed out fails with Aborted.
  virtual void group_discard() = 0;
  // Whether this thread has a group open (its calls are being collected).
  virtual bool in_group() const = 0;
  // n calls of one collective as one group: call i is `common` on buffers[i] (its input, output
  // and dtype), collected and run as group_start(), n run()s and group_end(async) would, without
  // a virtual call per buffer. An error discards the group. Not inside an open group.
  struct CallBuffers {
    Buffer input, output;
    DataType dtype;
  };
  virtual std::shared_ptr<Work> run_coalesced(const CollectiveArgs& common, const CallBuffers* buffers, size_t n,
                                              bool async) = 0;
  // The checks run() makes before any traffic, alone: throws InvalidArgument or returns what
  // they made of the call.
  virtual ValidatedCall validate(const CollectiveArgs& args) const = 0;
  // Resolves "auto" for a call whose per-rank block is `bytes` bytes, as run() would;
  // deterministic: as a call in deterministic mode (the setting's or the call's).
  virtual Algo choose_algo(Collective coll, Algo requested, uint64_t bytes, DataType dtype, ReduceOp op = ReduceOp::Sum,
                           bool deterministic = false) const = 0;
  // Every algorithm available for such a call, with the cost model's prediction; deterministic:
  // those a call in deterministic mode chooses from (rank_order, and oneshot where it fits;
  // for a floating-point reduction), so its cost can be set against auto's choice.
  virtual std::vector<AlgoEstimate> estimate(Collective coll, uint64_t bytes, DataType dtype,
                                             bool deterministic = false) const = 0;
  // Replaces auto's last decision from now on (null: the cost model's again). Set it on every
  // rank, between calls.
  virtual void set_choice_hook(std::shared_ptr<ChoiceHook> hook) = 0;
  // What set-up found and the counters since (see CommStatus).
  virtual CommStatus status() const = 0;
  // The IPv4 address this rank's peers reach it at (its mesh address): where a new rendezvous
  // it leads (shrink, grow) must listen so that the same peers can reach it.
  virtual std::string address() const = 0;

  // Tagged messages, beside the call order (runtime/messenger.h). isend completes once the
  // bytes are written (the buffer may then be reused); it never waits for a matching receive.
  virtual std::shared_ptr<MessageWork> isend(const void* ptr, uint64_t bytes, int dst, int64_t tag) = 0;
  // Receives the first message from `src` (kAnySource: any) with `tag` (kAnyTag: any) into at
  // most capacity_bytes at ptr.
  virtual std::shared_ptr<MessageWork> irecv(void* ptr, uint64_t capacity_bytes, bool readonly, int src,
                                             int64_t tag) = 0;
  // The first matching message that arrived and is not yet received, without receiving it:
  // probe waits up to timeout_s (<= 0: the communicator's timeout), iprobe returns false now.
  virtual MessageStatus probe(int src, int64_t tag, double timeout_s) = 0;
  virtual bool iprobe(int src, int64_t tag, MessageStatus& found) = 0;
  // Finishes queued work, tells the peers this rank is leaving, releases every resource.
  virtual void close() = 0;
  virtual bool is_aborted() const = 0;
  // From any thread: ends the calls in flight and every later call on every rank with Aborted
  // (a watchdog's way to stop a stuck job). The communicator cannot be used afterwards.
  virtual void abort(const std::string& why) = 0;

  // The flight recorder (runtime/flight_recorder.h): this rank's last calls as JSON, with why the
  // dump was taken ("request", "signal", "exit", or the error kind that triggered it).
  virtual std::string dump_json(const std::string& reason) const = 0;
  // The same across ranks: 16 hex digits rank 0 drew at random for this set-up (no bit of the
  // secret), for naming dump files.
  virtual std::string id() const = 0;
  // The unique id of a communicator formed from this one's ranks at ip:port with a public
  // `nonce` (UniqueId::child): split, shrink and grow send only the nonce and the address.
  virtual UniqueId child_unique_id(const std::string& ip, uint16_t port,
                                   const std::array<uint8_t, 16>& nonce) const = 0;
  // Calls issued from now on carry `label` in the recorder (a bucket id, a step; -1: none).
  virtual void set_label(int64_t label) = 0;
  // This rank's clock minus rank 0's (ns, steady clock) and the estimate's error, as measured
  // at set-up or later by the caller.
  virtual void set_clock_offset(int64_t offset_ns, int64_t error_ns) = 0;
};

}  // namespace ringtree
