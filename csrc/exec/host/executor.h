// The host executor: runs lowered calls (exec/plan.h) over this rank's connections, with a
// progress engine that spins briefly, then blocks in poll() on the doorbell, the TCP sockets it
// waits for and every peer's control connection; and one-shot (oneshot.cc) for small
// calls when every rank shares this host.
//
// It knows connections, not communicators: the call order, validation, the algorithm choice and
// what happens after a failure belong to the communicator (runtime/) that drives it.
#pragma once
#include <poll.h>
#include <array>
#include <functional>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include "algorithms/schedule.h"
#include "common/oneshot.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/control_plane.h"
#include "common/clock.h"
#include "common/numa.h"
#include "exec/host/backoff.h"
#include "exec/plan.h"
#include "transport/doorbell.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"

namespace ringtree {

class AlignedBuffer {
 public:
  ~AlignedBuffer() { std::free(data_); }
  uint8_t* ensure(size_t bytes);
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// One call as the host executor runs it: the plan, the arguments it was lowered from (peers and
// the per-call sizes of sendrecv and all_to_all_v) and its place in the call order.
struct HostCall {
  CallPlan plan;
  const CollectiveArgs* args = nullptr;
  uint64_t seq = 0;
  uint64_t recv_seq = 0;  // sendrecv: the receive's p2p sequence number (seq is the send's)
};

// The wire header of a fingerprint, and back.
MsgHeader header_of(const Fingerprint& fp, int sender);
Fingerprint fingerprint_of(const MsgHeader& h);

// RINGTREE_STREAM_BYTES: -1 for auto (InvalidArgument for a bad value).
int64_t stream_bytes_setting();

class HostExecutor {
 public:
  // A send of a schedule with scratch completes only once the receiver has its data (acks are
  // deferred only without scratch, run_scheduled): lower() may then stage in the schedule.
  static constexpr bool kStagesInSchedule = true;
  HostExecutor(int rank, int size, ControlPlane& ctrl)
      : rank_(rank), size_(size), ctrl_(ctrl), waiting_(new std::atomic<uint8_t>[size]) {
    clear_waiting();
    open_wake_fd();
  }
  ~HostExecutor();
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  // Takes the mesh's TCP data connections and sets up shared memory with the ranks on this host
  // (a collective over `boot`). oneshot_bytes: a one-shot slot's capacity (0: no one-shot slots).
  // cores_shared: more ranks are allowed this rank's CPUs than there are of them (with
  // RINGTREE_CMA_MIN_BYTES auto, all_to_all blocks then go single-copy from a smaller size).
  void connect(Bootstrap& boot, Mesh& mesh, const UniqueId& uid, uint64_t ring_bytes, uint64_t oneshot_bytes,
               bool cores_shared);
  void set_wait_policy(const WaitPolicy& w) { wait_ = w; }
  // Waits that went straight to yielding because a peer they needed was on this CPU (any thread).
  uint64_t shared_cpu_waits() const { return shared_cpu_waits_.load(std::memory_order_relaxed); }

  // Runs the call; throws the typed error of the first failure.
  void run(const HostCall& call);
  // "all_reduce #3 (...)" with the peers of a point-to-point call; "no collective" between calls.
  std::string describe_current() const;

  // What a rank may publish in its one-shot slot (oneshot.cc) in one call: 0 where one-shot is not
  // usable (some rank on another host, or RINGTREE_ONESHOT_BYTES=0).
  uint64_t oneshot_capacity() const { return oneshot_usable_ ? oneshot_bytes_ : 0; }

  std::string transport_to(int peer) const;
  // Whether large collective messages between ranks on this host go single-copy (cma.h), and why
  // not where they do not: "on: ..." or "off: ...".
  const std::string& single_copy_status() const { return single_copy_status_; }
  // The host's last-level cache as the machine figures give it, every rank the same (set-up, after
  // connect): outputs from half of it are written with streaming stores (RINGTREE_STREAM_BYTES
  // auto), and where every rank has a core of its own, a broadcast this large takes the ring.
  void set_last_level_cache_bytes(uint64_t bytes);
  // Messages this rank has received single-copy so far (between calls).
  uint64_t single_copy_messages() const;
  // The pipeline segment for a call of `bytes` (0: RINGTREE_TREE_SEGMENT_BYTES), the same on every
  // rank: larger for a broadcast whose receivers all read single-copy from the root.
  uint64_t segment_bytes_for(Collective coll, Algo algo, uint64_t bytes) const;
  // Broadcasts of [first, second) bytes run the flat tree ('direct') where the root's buffer lies
  // mostly on huge pages and the binary tree where not (set_last_level_cache_bytes), the same on
  // every rank: the root's page scan (cma.h) decides, and its peers must hear it first. {0, 0}: none.
  std::pair<uint64_t, uint64_t> broadcast_asks_root() const {
    return root_pages_broadcast_below_ ? std::make_pair(single_copy_min_bytes_, root_pages_broadcast_below_)
                                       : std::make_pair(uint64_t{0}, uint64_t{0});
  }
  // This rank's NUMA node and where its shared memory was placed (numa.h).
  std::string numa_status() const;
  // Every rank's node as this rank can know it: its own, and those of the ranks it shares memory
  // with (from their segments); -1 for the others (another host) and where unknown.
  std::vector<int> numa_nodes() const;
  uint64_t streamed_pieces() const;
  // The connection to rank q where the pair talks over shared memory, else null.
  const ShmConnection* shm_connection(int q) const;
  // One line per shared-memory writer of this rank (its one-shot slots, its ring to each local peer):
  // which stores it uses and why (SharedStores::describe).
  std::string shm_stores() const;
  // From any thread: the call in progress (and any later one) raises Aborted with `why` as soon
  // as its rank would otherwise wait, a sleeping rank is woken for it.
  void abort(const std::string& why);
  // The peers the call in progress still waits for, as of its last sleep (safe from any thread):
  // the ranks it still sends to, and those it still expects data from.
  void waiting_on(std::vector<int>& sends, std::vector<int>& recvs) const;
  // Releases connections and shared memory.
  void close();

 private:
  struct OpCursor {
    const Op* op;
    Connection* conn;
    int peer;
    bool is_send;
    bool done;
    uint64_t payload_bytes;
    SendCursor send;
    RecvCursor recv;
    MsgHeader expect;  // receives: the header this message must carry
  };
  struct Device;  // run_plan's device policy over this executor
  // For a call that fails: the peers' unread single-copy messages from it are withdrawn (shm.h).
  void withdraw_single_copy_sends();

  void open_wake_fd();
  void setup_shared_memory(Bootstrap& boot, const Mesh& mesh, const UniqueId& uid, uint64_t ring_bytes,
                           bool cores_shared);
  // After every segment is mapped: probes single-copy reads from each peer on this host, and
  // (after a barrier) turns them on for every connection here only if every rank here succeeded.
  void probe_single_copy(Bootstrap& boot, const std::vector<int>& local_peers, bool cores_shared);
  void walk(uint8_t* in, uint8_t* out);
  void run_scheduled(uint8_t* in, uint8_t* out);
  const Schedule& schedule_for(const HostCall& c);
  void run_schedule(const Schedule& s, uint8_t* const bases[3], const Deadline& deadline);
  void init_cursor(OpCursor& c, const Op& op, uint8_t* const bases[3]);
  bool progress_all();
  bool progress_recv_checked(OpCursor& c);
  bool step_done(bool final) const;
  void pump(const Deadline& deadline, bool final);
  void block(const Deadline& deadline, bool final);
  // Sleeps in poll() on pollfds_ (data descriptors the caller put there), the doorbell and every
  // peer's control connection, unless `ready` (asked after the sleeping flag is up) says not to.
  void doze(const Deadline& deadline, const std::function<bool()>& ready);
  void check_header(const MsgHeader& got, const MsgHeader& want, uint64_t want_payload, int peer) const;
  [[noreturn]] void throw_timeout() const;
  void raise_if_aborted();
  // Records what block() is about to wait for (waiting_on); cleared when a call ends.
  void note_waiting(int peer, bool send);
  void clear_waiting();
  // One-shot (oneshot.cc).
  void publish_oneshot(const MsgHeader& fp, const uint8_t* payload, uint64_t bytes, uint64_t gen);
  SharedStores oneshot_stores_;  // this rank's one-shot payloads
  void run_oneshot(const uint8_t* in, uint8_t* out);
  void oneshot_block(const MsgHeader& fp, double timeout_s, const Deadline& deadline, uint64_t gen);
  void await_oneshot(uint64_t gen, const MsgHeader& fp, double timeout_s);
  void settle_oneshot_through(uint64_t last_gen, double timeout_s);
  void settle_oneshot_published(double timeout_s);
  void settle_oneshot(double timeout_s);
  void check_oneshot_mismatch() const;

  int rank_, size_;
  ControlPlane& ctrl_;
  std::vector<std::unique_ptr<Connection>> conns_;
  bool have_shm_ = false;
  Doorbell bell_;
  std::unique_ptr<ShmSegment> own_segment_;
  std::vector<std::unique_ptr<ShmSegment>> peer_segments_;
  WaitPolicy wait_;
  // At the start of a wait: publishes this rank's CPU and says whether a peer the wait needs
  // (the step's open cursors, or the missing ranks of a one-shot call) last started a wait on it.
  bool awaited_peer_on_this_cpu(bool oneshot);
  // How a wait of pump() starts: Block when every open transfer is over TCP, Yield when an
  // awaited peer last waited on this CPU, else Spin (backoff.h).
  WaitStart pump_wait_start();
  std::atomic<uint64_t> shared_cpu_waits_{0};
  uint64_t stream_bytes_ = 0;   // outputs this large are received with streaming stores
  bool stream_out_ = false;     // the current call's
  bool stream_copies_ = false;  // ... and its local copies into the output too (no reduction reads them back)
  std::string single_copy_status_ = "off: no other rank shares memory with this one";
  bool single_copy_on_ = false;
  uint64_t single_copy_min_bytes_ = 0;               // RINGTREE_CMA_MIN_BYTES, or auto's 1 MiB
  uint64_t single_copy_all_to_all_min_bytes_ = 0;    // ... for all_to_all (auto: less where cores are shared)
  uint64_t broadcast_ring_from_bytes_ = UINT64_MAX;  // a broadcast this large goes through the ring
  bool single_copy_from_huge_pages_only_ = false;    // auto: a send mostly on small pages takes the ring (cma.h)
  bool host_cores_shared_ = false;                   // some rank of this host shares its cores
  bool host_huge_pages_possible_ = false;            // some rank of this host may have huge pages
  uint64_t root_pages_broadcast_below_ = 0;          // broadcast_asks_root up to this size
  bool single_copy_huge_only_ = false;               // ... the rule, for the current call
  uint64_t single_copy_from_ = 0;                    // the current call's sends this large go single-copy (0: none)
  bool single_copy_defer_ = false;                   // ... and complete before they are acknowledged
  std::vector<std::pair<int, ShmConnection*>> single_copy_conns_;  // (peer, connection) where on
  bool single_copy_acked() const;
  uint64_t single_copy_probe_word_ = 0;  // peers read it during set-up (probe_single_copy)
  NumaPlacement numa_;
  std::string numa_refused_;     // why its segment is not bound to numa_.node ("": bound)
  bool oneshot_usable_ = false;  // every rank is on this host: one-shot connects them all
  uint64_t oneshot_bytes_ = 0;   // payload capacity of a one-shot slot
  uint64_t oneshot_gen_ = 0;     // one-shot calls so far
  std::vector<uint8_t> oneshot_arrived_;
  // One-shot calls this rank returned from before some ranks had published them (oneshot.cc): a
  // broadcast's or a count-0 call's, oldest first.
  struct UnsettledOneShotCall {
    uint64_t gen;
    MsgHeader fp;
    int unawaited;  // the rank its deferred steps do not wait for (Schedule::deferred_unawaited), or -1
  };
  // A ring: the oldest at oneshot_unsettled_first_, so settling one moves nothing.
  std::array<UnsettledOneShotCall, kOneShotRunAhead> oneshot_unsettled_{};
  size_t oneshot_unsettled_first_ = 0;
  size_t oneshot_unsettled_count_ = 0;

  std::unordered_map<ScheduleKey, Schedule, ScheduleKeyHash> schedules_;
  ScheduleKey last_key_{};
  const Schedule* last_schedule_ = nullptr;
  AlignedBuffer scratch_, temp_;
  Schedule per_call_schedule_;  // sendrecv and all_to_all_v: per-call sizes are not a cache key
  std::vector<OpCursor> cursors_;
  OpCursor hs_send_{}, hs_recv_{};
  bool hs_send_pending_ = false, hs_recv_pending_ = false;
  std::vector<pollfd> pollfds_;
  std::vector<int> pollfd_peer_;
  std::unique_ptr<std::atomic<uint8_t>[]> waiting_;  // per peer: bit 0 send, bit 1 receive
  int wake_fd_ = -1;                                 // an eventfd abort() writes; every sleep polls it
  std::atomic<bool> aborting_{false};
  std::mutex abort_mu_;
  std::string abort_why_;
  const HostCall* current_ = nullptr;
  MsgHeader current_fp_{};
};

}  // namespace ringtree
