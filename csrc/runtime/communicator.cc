// Communicator set-up, validation, algorithm choice and the call queue. The progress engine
// that runs a schedule lives in executor.cc.
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/env.h"
#include "kernels/host/reduce.h"
#include "runtime/communicator_impl.h"
#include "transport/tcp/tcp.h"

namespace ringtree {

namespace {

// Settings (documented in the README's table).
RT_PARAM(ShmRingBytes, "RINGTREE_SHM_RING_BYTES", 1 << 20)
RT_PARAM(SpinMicros, "RINGTREE_SPIN_US", -1)
RT_PARAM(YieldMicros, "RINGTREE_YIELD_US", 2000)
RT_PARAM(BoardBytes, "RINGTREE_ONESHOT_BYTES", 64 << 10)
RT_PARAM(StreamBytes, "RINGTREE_STREAM_BYTES", 4 << 20)

int online_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

std::string host_identity() {
  std::string h = env_str("RINGTREE_HOSTNAME", "");
  if (!h.empty()) return h;
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

Algo parse_algo_setting() {
  std::string v = env_str("RINGTREE_ALGO", "auto");
  if (v == "auto") return Algo::Auto;
  if (v == "ring") return Algo::Ring;
  if (v == "tree") return Algo::Tree;
  if (v == "oneshot") return Algo::OneShot;
  RT_THROW(InvalidArgument, "RINGTREE_ALGO must be auto, ring, tree or oneshot, got '", v, "'");
}

}  // namespace

uint8_t* AlignedBuffer::ensure(size_t bytes) {
  if (bytes <= bytes_ && data_) return data_;
  std::free(data_);
  const size_t rounded = std::max<size_t>(64, (bytes + 63) & ~size_t{63});
  data_ = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
  if (!data_) throw std::bad_alloc();
  bytes_ = rounded;
  return data_;
}

std::shared_ptr<Communicator> Communicator::create(int rank, int size, const UniqueId& uid, double timeout_s) {
  return std::make_shared<CommunicatorImpl>(rank, size, uid, timeout_s);
}

CommunicatorImpl::CommunicatorImpl(int rank, int size, const UniqueId& uid, double timeout_s)
    : rank_(rank), size_(size), uid_(uid), default_timeout_(timeout_s) {
  RT_CHECK(timeout_s > 0, InvalidArgument, "timeout must be positive, got ", timeout_s);
  forced_algo_ = parse_algo_setting();
  for (int c = 0; c < static_cast<int>(Collective::Count); ++c) scheduled_algos_[c] = supported_algos(static_cast<Collective>(c));
  stream_bytes_ = static_cast<uint64_t>(std::max<int64_t>(0, StreamBytes()));
  kernel_isa_name();  // a bad RINGTREE_KERNEL_ISA fails here, not inside a collective
  const std::string transport = env_str("RINGTREE_TRANSPORT", "auto");
  RT_CHECK(transport == "auto" || transport == "tcp", InvalidArgument,
           "RINGTREE_TRANSPORT must be auto or tcp, got '", transport, "'");

  Bootstrap boot(rank, size, uid, timeout_s);
  mesh_ = boot.connect(host_identity(), transport == "tcp");
  conns_.resize(size);
  peer_state_.assign(size, PeerState::Alive);
  p2p_send_seq_.assign(size, 0);
  p2p_recv_seq_.assign(size, 0);
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    if (mesh_.pair_uses_tcp(rank, q)) {
      conns_[q] = std::make_unique<TcpConnection>(q, mesh_.data_fd[q]);
      mesh_.data_fd[q] = -1;  // owned by the connection now
    } else {
      have_shm_ = true;
    }
    set_nonblocking(mesh_.ctrl_fd[q]);
  }
  setup_shared_memory(boot);
  setup_cost_model(boot);
  boot.close_star();

  // Spin while every local rank can have a core; when oversubscribed, hand the core over fast.
  int local_ranks = 1;
  for (int q = 0; q < size; ++q)
    if (q != rank && mesh_.peers[q].host == mesh_.peers[rank].host) ++local_ranks;
  const bool oversubscribed = local_ranks > online_cpus();
  wait_.spin_ns = 1000 * (SpinMicros() >= 0 ? SpinMicros() : (oversubscribed ? 1 : 1000));
  wait_.yield_ns = 1000 * std::max<int64_t>(0, YieldMicros());
}

// Every rank owns a segment with one ring per shared-memory sender. Segments are created,
// then opened by the peers, then unlinked: nothing is left in /dev/shm even if a rank dies.
void CommunicatorImpl::setup_shared_memory(Bootstrap& boot) {
  const std::string prefix = "/rt-" + uid_.secret_hex().substr(0, 16) + "-" + std::to_string(uid_.port) + "-";
  const uint64_t ring_bytes = std::max<uint64_t>(4096, static_cast<uint64_t>(ShmRingBytes()) & ~uint64_t{63});
  // senders_of[r]: the ranks that write into r's segment, in rank order; slot = position.
  auto senders_of = [&](int r) {
    std::vector<int> v;
    for (int q = 0; q < size_; ++q)
      if (q != r && !mesh_.pair_uses_tcp(r, q)) v.push_back(q);
    return v;
  };
  const std::vector<int> my_senders = senders_of(rank_);
  // The board needs every rank on this host; every rank derives the same answer from the mesh.
  const bool all_local = size_ > 1 && mesh_.no_pair_uses_tcp();
  board_usable_ = all_local && BoardBytes() > 0;
  board_bytes_ = all_local ? (std::max<int64_t>(0, BoardBytes()) + 63) & ~uint64_t{63} : 0;
  board_arrived_.assign(size_, 0);
  if (have_shm_) {
    bell_.open("ringtree." + uid_.secret_hex().substr(0, 16) + "." + std::to_string(uid_.port), rank_, size_);
    own_segment_ = std::make_unique<ShmSegment>();
    own_segment_->create(prefix + std::to_string(rank_), static_cast<int>(my_senders.size()), ring_bytes, board_bytes_);
  }
  boot.barrier();  // every segment exists
  peer_segments_.resize(size_);
  for (int q : my_senders) {
    peer_segments_[q] = std::make_unique<ShmSegment>();
    peer_segments_[q]->open(prefix + std::to_string(q), static_cast<int>(senders_of(q).size()), ring_bytes, board_bytes_);
  }
  boot.barrier();  // every segment is mapped by everyone who needs it
  if (have_shm_) ShmSegment::unlink(prefix + std::to_string(rank_));
  for (size_t i = 0; i < my_senders.size(); ++i) {
    const int q = my_senders[i];
    const std::vector<int> theirs = senders_of(q);
    const int out_slot = static_cast<int>(std::find(theirs.begin(), theirs.end(), rank_) - theirs.begin());
    ShmSegment& peer = *peer_segments_[q];
    conns_[q] = std::make_unique<ShmConnection>(q, peer.ring(out_slot), peer.ring_data(out_slot), own_segment_->ring(static_cast<int>(i)),
                                                own_segment_->ring_data(static_cast<int>(i)), ring_bytes,
                                                &peer.header()->sleeping, &bell_);
  }
}

CommunicatorImpl::~CommunicatorImpl() {
  try {
    close();
  } catch (...) {
  }
}

std::string CommunicatorImpl::transport_to(int peer) const {
  RT_CHECK(peer >= 0 && peer < size_, InvalidArgument, "peer must be in [0, ", size_, "), got ", peer);
  if (peer == rank_) return "self";
  return conns_[peer] ? conns_[peer]->kind() : "closed";
}

std::vector<Algo> CommunicatorImpl::available_algos(Collective coll, uint64_t bytes) const {
  std::vector<Algo> algos = scheduled_algos_[static_cast<int>(coll)];
  if (board_fits(coll, bytes)) algos.push_back(Algo::OneShot);
  return algos;
}

Algo CommunicatorImpl::choose_algo(Collective coll, Algo requested, uint64_t bytes, DataType dtype) const {
  RT_CHECK(coll < Collective::Count, InvalidArgument, "unknown collective code ", static_cast<int>(coll));
  // Runs on every call: no allocation unless the request is refused.
  const std::vector<Algo>& scheduled = scheduled_algos_[static_cast<int>(coll)];
  const bool board = board_fits(coll, bytes);
  auto is_supported = [&](Algo a) {
    return (a == Algo::OneShot && board) || std::find(scheduled.begin(), scheduled.end(), a) != scheduled.end();
  };
  if (requested != Algo::Auto) {
    if (is_supported(requested)) return requested;
    std::string names;
    for (Algo a : available_algos(coll, bytes)) names += std::string(algo_name(a)) + ", ";
    if (requested == Algo::OneShot && board_payload_bytes(coll, bytes) != UINT64_MAX)
      RT_THROW(InvalidArgument, "algo 'oneshot' is not available for this ", collective_name(coll), ": it needs every rank",
               " on one host and at most ", board_bytes_, " bytes per rank on the board (RINGTREE_ONESHOT_BYTES); this call",
               board_usable_ ? str_cat(" puts ", board_payload_bytes(coll, bytes), " there") : std::string(" spans hosts or uses TCP"),
               "; choose from ", names, "auto");
    RT_THROW(InvalidArgument, "algo '", algo_name(requested), "' is not available for ", collective_name(coll),
             "; choose from ", names, "auto");
  }
  if (forced_algo_ != Algo::Auto && is_supported(forced_algo_)) return forced_algo_;
  if (scheduled.size() == 1 && !board) return scheduled.front();
  // The cheapest prediction; near-ties (within 1%) go to the earlier, simpler algorithm.
  Algo best = scheduled.front();
  double best_s = predict(costs_, prices_, coll, best, bytes, dtype, nullptr);
  auto consider = [&](Algo a) {
    const double t = predict(costs_, prices_, coll, a, bytes, dtype, nullptr);
    if (t < best_s * 0.99) best = a, best_s = t;
  };
  for (size_t i = 1; i < scheduled.size(); ++i) consider(scheduled[i]);
  if (board) consider(Algo::OneShot);
  return best;
}

std::vector<AlgoEstimate> CommunicatorImpl::estimate(Collective coll, uint64_t bytes, DataType dtype) const {
  RT_CHECK(coll < Collective::Count, InvalidArgument, "unknown collective code ", static_cast<int>(coll));
  RT_CHECK(dtype < DataType::Count, InvalidArgument, "unknown dtype code ", static_cast<int>(dtype));
  const std::vector<Algo> algos = available_algos(coll, bytes);
  std::vector<AlgoEstimate> out;
  for (const Candidate& c : price(costs_, prices_, coll, algos, bytes, dtype))
    out.push_back({c.algo, c.seconds, c.terms});
  return out;
}

std::string CommunicatorImpl::machine_costs() const {
  const MachineCosts& m = costs_;
  return str_cat("source ", m.measured == 1 ? "measured" : m.measured == 2 ? "cached" : "defaults",
                 "\ncall_us ", m.call_s * 1e6, "\nhop_us ", m.hop_s * 1e6, "\nswitch_us ", m.switch_s * 1e6,
                 "\ncopy_hot_GBps ", m.copy_hot_Bps / 1e9, "\ncopy_cold_GBps ", m.copy_cold_Bps / 1e9,
                 "\nreduce_hot_GBps ", m.reduce_hot_Bps / 1e9, "\nreduce_cold_GBps ", m.reduce_cold_Bps / 1e9,
                 "\nl2_KiB ", m.l2_bytes / 1024, "\nl3_KiB ", m.l3_bytes / 1024, "\ncores ", m.cores, "\nlocal_ranks ", m.local_ranks, "\nany_tcp ", m.any_tcp);
}

// Rank 0 measures (or reads its host's cache) and every rank adopts its figures: choices
// must agree on every rank, and a per-rank measurement would not.
void CommunicatorImpl::setup_cost_model(Bootstrap& boot) {
  if (rank_ == 0) {
    const std::string model = env_str("RINGTREE_COST_MODEL", "measure");
    RT_CHECK(model == "measure" || model == "defaults", InvalidArgument,
             "RINGTREE_COST_MODEL must be measure or defaults, got '", model, "'");
    costs_ = model == "defaults" ? MachineCosts{} : measure_machine(host_identity());
    if (costs_.measured == 0) costs_.cores = online_cpus();
    costs_.local_ranks = 0;
    for (int q = 0; q < size_; ++q) costs_.local_ranks += mesh_.peers[q].host == mesh_.peers[0].host;
    costs_.any_tcp = size_ > 1 && !mesh_.no_pair_uses_tcp();
  }
  static_assert(std::is_trivially_copyable_v<MachineCosts>, "sent as bytes");
  boot.broadcast_from_root(&costs_, sizeof(costs_));
  // The schedules' counts depend only on P (and the segment setting), so every rank builds the
  // same table; choose_algo() then prices from it without allocating.
  prices_.build(size_);
}

Prepared CommunicatorImpl::prepare(const CollectiveArgs& a) const {
  RT_CHECK(a.dtype < DataType::Count, InvalidArgument, "unsupported dtype code ", static_cast<int>(a.dtype));
  const Collective c = a.coll;
  RT_CHECK(c < Collective::Count, InvalidArgument, "unknown collective code ", static_cast<int>(c));
  const char* name = collective_name(c);
  const size_t esz = dtype_size(a.dtype);
  const uint64_t P = static_cast<uint64_t>(size_);
  const bool reduces = is_reduction(c);
  const bool rooted = is_rooted(c);
  if (reduces) {
    RT_CHECK(a.op < ReduceOp::Count, InvalidArgument, name, ": unknown reduce op code ", static_cast<int>(a.op));
    RT_CHECK(a.op != ReduceOp::PremulSum || std::isfinite(a.premul_factor), InvalidArgument, name,
             ": premul_sum factor must be finite, got ", a.premul_factor);
  }
  if (rooted)
    RT_CHECK(a.root >= 0 && a.root < size_, InvalidArgument, name, ": root must be in [0, ", size_, "), got ", a.root);
  if (c == Collective::Send || c == Collective::Recv || c == Collective::SendRecv) {
    RT_CHECK(a.peer >= 0 && a.peer < size_, InvalidArgument, name, ": peer must be in [0, ", size_, "), got ", a.peer);
    RT_CHECK(a.peer != rank_, InvalidArgument, name, ": peer must differ from this rank (", rank_, ")");
  }
  if (c == Collective::SendRecv) {
    RT_CHECK(a.recv_peer >= 0 && a.recv_peer < size_, InvalidArgument, name, ": source must be in [0, ", size_,
             "), got ", a.recv_peer);
    RT_CHECK(a.recv_peer != rank_, InvalidArgument, name, ": source must differ from this rank (", rank_, ")");
  }
  const bool is_root = a.root == rank_;
  // Which buffers this rank must supply, and which it writes.
  bool need_in = true, need_out = true, writes_out = true;
  switch (c) {
    case Collective::Broadcast: need_out = false; writes_out = false; break;  // one buffer: input
    case Collective::Reduce: need_out = false; writes_out = is_root; break;
    case Collective::Gather: need_out = is_root; writes_out = is_root; break;
    case Collective::Scatter: need_in = is_root; break;
    case Collective::Barrier: need_in = need_out = writes_out = false; break;
    case Collective::Send: need_out = writes_out = false; break;
    case Collective::Recv: need_in = false; break;
    default: break;
  }
  Buffer in = a.input, out = a.output;
  if (need_in) RT_CHECK(in.present, InvalidArgument, name, ": an input buffer is required on rank ", rank_);
  if (need_out) RT_CHECK(out.present, InvalidArgument, name, ": an output buffer is required on rank ", rank_);
  // Reduce without an output on the root reduces in place.
  if (c == Collective::Reduce && is_root && !out.present) out = in;
  if (c == Collective::Broadcast) out = in;
  for (const Buffer* b : {&in, &out})
    RT_CHECK(!b->present || b->ptr || b->count == 0, InvalidArgument, name, ": null buffer with ", b->count, " elements");
  if (c == Collective::Broadcast && !is_root)
    RT_CHECK(!in.readonly, InvalidArgument, name, ": the buffer is read-only but rank ", rank_, " receives into it");
  if (writes_out && c != Collective::Broadcast)
    RT_CHECK(!out.readonly, InvalidArgument, name, ": the output buffer is read-only");

  Prepared p;
  p.args = a;
  p.timeout_s = a.timeout_s > 0 ? a.timeout_s : default_timeout_;
  p.args.input = in;
  p.args.output = out;
  switch (c) {
    case Collective::AllReduce:
      RT_CHECK_EQ(out.count, in.count, "all_reduce: output element count must equal the input's");
      p.count = in.count;
      break;
    case Collective::ReduceScatter:
      RT_CHECK_EQ(in.count, out.count * P, str_cat("reduce_scatter: input element count must be output count x world size (", out.count, " x ", P, ")"));
      p.count = out.count;
      break;
    case Collective::AllGather:
      RT_CHECK_EQ(out.count, in.count * P, str_cat("all_gather: output element count must be input count x world size (", in.count, " x ", P, ")"));
      p.count = in.count;
      break;
    case Collective::AllToAll:
      RT_CHECK_EQ(out.count, in.count, "all_to_all: output element count must equal the input's");
      RT_CHECK(in.count % P == 0, InvalidArgument, "all_to_all: element count ", in.count, " is not divisible by the world size ", P);
      p.count = in.count / P;
      break;
    case Collective::Broadcast: p.count = in.count; break;
    case Collective::Reduce:
      if (is_root) RT_CHECK_EQ(out.count, in.count, "reduce: output element count on the root must equal the input's");
      p.count = in.count;
      break;
    case Collective::Gather:
      if (is_root) RT_CHECK_EQ(out.count, in.count * P, str_cat("gather: output element count on the root must be input count x world size (", in.count, " x ", P, ")"));
      p.count = in.count;
      break;
    case Collective::Scatter:
      if (is_root) RT_CHECK_EQ(in.count, out.count * P, str_cat("scatter: input element count on the root must be output count x world size (", out.count, " x ", P, ")"));
      p.count = out.count;
      break;
    case Collective::Barrier: p.count = 0; break;
    case Collective::AllToAllV: {
      RT_CHECK_EQ(a.send_counts.size(), P, "all_to_all_v: send_counts must have one entry per rank");
      RT_CHECK_EQ(a.recv_counts.size(), P, "all_to_all_v: recv_counts must have one entry per rank");
      uint64_t sent = 0, received = 0;
      for (uint64_t n : a.send_counts) sent += n;
      for (uint64_t n : a.recv_counts) received += n;
      RT_CHECK_EQ(in.count, sent, "all_to_all_v: input element count must equal sum(send_counts)");
      RT_CHECK_EQ(out.count, received, "all_to_all_v: output element count must equal sum(recv_counts)");
      RT_CHECK_EQ(a.recv_counts[rank_], a.send_counts[rank_],
                  str_cat("all_to_all_v: recv_counts[", rank_, "] must equal send_counts[", rank_, "] (this rank's own block)"));
      p.count = 0;  // counts differ per rank; each message's size is checked on arrival instead
      break;
    }
    case Collective::Send: case Collective::SendRecv: p.count = in.count; break;
    case Collective::Recv: p.count = out.count; break;
    default: break;
  }
  // Buffers may overlap only in the in-place layouts each collective supports.
  if (in.present && out.present && c != Collective::Broadcast) {
    const size_t in_bytes = in.count * esz, out_bytes = out.count * esz;
    const auto* ip = static_cast<const uint8_t*>(in.ptr);
    const auto* op = static_cast<const uint8_t*>(out.ptr);
    const size_t block = p.count * esz;
    const bool in_is_out_block = (c == Collective::AllGather || (c == Collective::Gather && is_root)) &&
                                 ip == op + static_cast<size_t>(rank_) * block;
    const bool out_is_in_block = (c == Collective::ReduceScatter || (c == Collective::Scatter && is_root)) &&
                                 op == ip + static_cast<size_t>(rank_) * block;
    // all_reduce and reduce reduce element-wise in place; all_to_all(_v) stages its input.
    const bool same_buffer_ok = in.ptr == out.ptr && (c == Collective::AllReduce || c == Collective::Reduce);
    const bool staged = c == Collective::AllToAll || c == Collective::AllToAllV;
    RT_CHECK(c != Collective::SendRecv || !ranges_overlap(in.ptr, in_bytes, out.ptr, out_bytes), InvalidArgument,
             name, ": the send and receive buffers overlap");
    if (!in_is_out_block && !out_is_in_block && !same_buffer_ok && !staged)
      RT_CHECK(!ranges_overlap(in.ptr, in_bytes, out.ptr, out_bytes), InvalidArgument, name,
               ": input and output overlap; in place means the same buffer for all_reduce, reduce and",
               " all_to_all, and this rank's block of the larger buffer for all_gather, gather, reduce_scatter",
               " and scatter");
  }
  if (c == Collective::AllReduce && in.ptr == out.ptr) p.args.output = in;
  p.algo = choose_algo(c, a.algo, p.count * esz, a.dtype);
  return p;
}

std::shared_ptr<Work> CommunicatorImpl::run(const CollectiveArgs& args, bool async) {
  RT_CHECK(async || !args.ready, InvalidArgument, collective_name(args.coll),
           ": a call that waits for its input (a gate) is always async");
  Prepared p = prepare(args);
  std::unique_lock<std::mutex> lock(queue_mu_);
  if (closed_) RT_THROW(Aborted, "the communicator is closed");
  if (aborted_) RT_THROW(Aborted, "the communicator was aborted by an earlier error: ", abort_reason_);
  switch (p.args.coll) {
    case Collective::Send: p.seq = p2p_send_seq_[p.args.peer]++; break;
    case Collective::Recv: p.seq = p2p_recv_seq_[p.args.peer]++; break;
    case Collective::SendRecv:
      p.seq = p2p_send_seq_[p.args.peer]++;
      p.recv_seq = p2p_recv_seq_[p.args.recv_peer]++;
      break;
    default: p.seq = next_seq_++; break;
  }
  if (async) {
    auto work = std::make_shared<Work>();
    queue_.push_back({std::move(p), work});
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    queue_cv_.notify_all();
    return work;
  }
  // Blocking calls run inline, after every earlier async call on this communicator; they
  // need no Work, so the common path allocates nothing.
  if (!queue_.empty() || worker_busy_) queue_cv_.wait(lock, [this] { return queue_.empty() && !worker_busy_; });
  lock.unlock();
  std::lock_guard<std::mutex> exec(exec_mu_);
  execute(p);
  return nullptr;
}

void CommunicatorImpl::worker_loop() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  for (;;) {
    queue_cv_.wait(lock, [this] { return stop_worker_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    worker_busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      std::lock_guard<std::mutex> exec(exec_mu_);
      execute(job.prepared);
    } catch (...) {
      error = std::current_exception();
    }
    // Before finish(): whoever waits on the Work sees the gate's follow-up already done.
    if (job.prepared.args.ready) job.prepared.args.ready->done();
    job.work->finish(error);
    lock.lock();
    worker_busy_ = false;
    queue_cv_.notify_all();
  }
}

void CommunicatorImpl::close() {
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (closed_) return;
    closed_ = true;
    // Queued work finishes first (or fails on its own timeout); then the worker stops.
    stop_worker_ = true;
    queue_cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> exec(exec_mu_);
  broadcast_abort(static_cast<AbortKind>(0), "");  // kind 0: goodbye
  for (int& fd : mesh_.ctrl_fd) close_fd(fd);
  conns_.clear();
  peer_segments_.clear();
  own_segment_.reset();
}

}  // namespace ringtree
