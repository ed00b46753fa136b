// The host communicator: owns the connections, validates calls, resolves algorithms, and runs
// schedules with a progress engine that spins briefly, then blocks in poll() on the doorbell,
// the TCP sockets it waits for and every peer's control connection.
#pragma once
#include <poll.h>
#include <atomic>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>
#include <vector>
#include "algorithms/schedule.h"
#include "bootstrap/bootstrap.h"
#include "common/clock.h"
#include "exec/host/backoff.h"
#include "runtime/machine_probe.h"
#include "ringtree/communicator.h"
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

// A validated call: everything needed to run it and to fingerprint it.
struct Prepared {
  CollectiveArgs args;
  Algo algo = Algo::Auto;
  uint64_t count = 0;  // the fingerprint count (see ScheduleKey::count)
  uint64_t seq = 0;
  double timeout_s = 0;
  uint64_t recv_seq = 0;  // sendrecv: the receive's p2p sequence number (seq is the send's)
};

// "all_reduce #3 (count=..., dtype=..., op=..., algo=...)", for errors.
std::string describe_header(const MsgHeader& h);

class CommunicatorImpl : public Communicator {
 public:
  CommunicatorImpl(int rank, int size, const UniqueId& uid, double timeout_s);
  ~CommunicatorImpl() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  double default_timeout() const override { return default_timeout_; }
  std::shared_ptr<Work> run(const CollectiveArgs& args, bool async) override;
  ValidatedCall validate(const CollectiveArgs& args) const override {
    const Prepared p = prepare(args);
    return {p.args.input, p.args.output, p.count};
  }
  Algo choose_algo(Collective coll, Algo requested, uint64_t bytes, DataType dtype) const override;
  std::vector<AlgoEstimate> estimate(Collective coll, uint64_t bytes, DataType dtype) const override;
  std::string machine_costs() const override;
  std::string transport_to(int peer) const override;
  void close() override;
  bool is_aborted() const override { return aborted_.load(); }

 private:
  enum class PeerState : uint8_t { Alive, Departed, Gone };  // Departed: said goodbye; Gone: no connection
  enum AbortKind : uint32_t { kAbortError = 1, kAbortTimeout, kAbortPeerFailure, kAbortMismatch };

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

  void setup_shared_memory(Bootstrap& boot);
  void setup_cost_model(Bootstrap& boot);
  std::vector<Algo> available_algos(Collective coll, uint64_t bytes) const;
  Prepared prepare(const CollectiveArgs& args) const;
  void execute(Prepared& p);
  void execute_traffic(Prepared& p);
  void run_scheduled(Prepared& p, uint8_t* in, uint8_t* out);
  const Schedule& schedule_for(const Prepared& p);
  MsgHeader fingerprint(const Prepared& p) const;
  void run_schedule(const Schedule& s, uint8_t* const bases[3], const Prepared& p, const Deadline& deadline);
  void init_cursor(OpCursor& c, const Op& op, uint8_t* const bases[3], const Prepared& p, const MsgHeader& fp);
  bool progress_all();
  bool progress_recv_checked(OpCursor& c);
  bool step_done(bool final) const;
  void pump(const Deadline& deadline, bool final);
  void block(const Deadline& deadline, bool final);
  // Sleeps in poll() on pollfds_ (data descriptors the caller put there), the doorbell and every
  // peer's control connection, unless `ready` (asked after the sleeping flag is up) says not to.
  void doze(const Deadline& deadline, const std::function<bool()>& ready);
  void handle_ctrl(int peer);
  void raise_pending_peer_abort();
  void raise_peer_abort_if_any();
  void check_header(const MsgHeader& got, const MsgHeader& want, uint64_t want_payload, int peer) const;
  [[noreturn]] void throw_timeout() const;
  void broadcast_abort(AbortKind kind, const std::string& text);
  void worker_loop();
  // The one-shot board (board.cc).
  uint64_t board_payload_bytes(Collective c, uint64_t block_bytes) const;
  bool board_fits(Collective c, uint64_t block_bytes) const;
  void publish_on_board(const MsgHeader& fp, const uint8_t* payload, uint64_t bytes, uint64_t gen);
  void run_board(const Prepared& p, const uint8_t* in, uint8_t* out);
  void board_block(const MsgHeader& fp, double timeout_s, const Deadline& deadline, uint64_t gen);
  void await_board(uint64_t gen, const MsgHeader& fp, double timeout_s);
  void settle_board(double timeout_s);
  void check_board_mismatch(const Prepared& p) const;
  std::string describe_current() const;

  int rank_, size_;
  UniqueId uid_;
  double default_timeout_;
  Mesh mesh_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<PeerState> peer_state_;
  bool have_shm_ = false;
  Doorbell bell_;
  std::unique_ptr<ShmSegment> own_segment_;
  std::vector<std::unique_ptr<ShmSegment>> peer_segments_;
  WaitPolicy wait_;
  uint64_t stream_bytes_ = 0;  // outputs this large are received with streaming stores
  bool stream_out_ = false;    // the current call's
  MachineCosts costs_;  // rank 0's, so every rank chooses alike
  PriceTable prices_;   // the schedules' counts at this P, built once at set-up
  bool board_usable_ = false;  // every rank is on this host: the one-shot board connects them all
  uint64_t board_bytes_ = 0;   // payload capacity of a board slot
  uint64_t board_gen_ = 0;     // one-shot calls so far (guarded by exec_mu_)
  std::vector<uint8_t> board_arrived_;
  // A one-shot broadcast this rank left before every rank had published it (board.cc).
  uint64_t board_unsettled_gen_ = 0;
  MsgHeader board_unsettled_fp_{};
  Algo forced_algo_ = Algo::Auto;
  std::vector<Algo> scheduled_algos_[static_cast<int>(Collective::Count)];  // supported_algos(), once

  // Call order state (guarded by queue_mu_).
  uint64_t next_seq_ = 0;
  std::vector<uint64_t> p2p_send_seq_, p2p_recv_seq_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> closed_{false};
  std::string abort_reason_;

  // Execution state (guarded by exec_mu_).
  std::mutex exec_mu_;
  std::unordered_map<ScheduleKey, Schedule, ScheduleKeyHash> schedules_;
  AlignedBuffer scratch_, premul_;
  Schedule all_to_all_v_schedule_;
  Schedule sendrecv_schedule_;  // rebuilt per call: per-peer counts are not a cache key
  std::vector<OpCursor> cursors_;
  OpCursor hs_send_{}, hs_recv_{};
  bool hs_send_pending_ = false, hs_recv_pending_ = false;
  std::vector<pollfd> pollfds_;
  std::vector<int> pollfd_peer_;
  const Prepared* current_ = nullptr;
  MsgHeader current_fp_{};
  bool abort_from_peer_ = false;
  // A peer's abort notice, raised once this rank can make no progress (or at its next call):
  // peers may run ahead, so the notice can concern a later call than the one this rank can
  // still finish with data already delivered.
  std::exception_ptr peer_abort_;

  // Async queue.
  struct Job {
    Prepared prepared;
    std::shared_ptr<Work> work;
  };
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Job> queue_;
  bool worker_busy_ = false;
  bool stop_worker_ = false;
  std::thread worker_;
};

}  // namespace ringtree
