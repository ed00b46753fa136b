// Communicator set-up, the call queue, status and failure handling. Validation and lowering live
// in exec/plan.cc, the algorithm choice in algo_choice.cc, the progress engine in exec/host.
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include "bootstrap/socket.h"
#include "common/check.h"
#include "common/settings.h"
#include "exec/host/wait_policy.h"
#include "kernels/host/reduce.h"
#include "runtime/communicator_impl.h"
#include "runtime/dumps.h"
#include "transport/shm/cma.h"
#include "transport/shm/shm.h"
#include "transport/tcp/tcp.h"

namespace ringtree {

namespace {

RT_SETTING(ShmRingBytes)
RT_SETTING(OneshotBytes)
RT_SETTING(FlightRecorderCalls)
RT_SETTING(DumpOnExit)
// Inter-host link figures for the cost model (the machine probe measures this host only).
RT_SETTING(TcpHopMicros)
RT_SETTING(TcpMBps)
// -1 where the setting is "auto" (or negative): the wait policy picks from the layout.
RT_AUTO_SETTING(SpinMicros)
RT_AUTO_SETTING(YieldMicros)

// Hosts as the data path sees them: ranks that talk over shared memory share a host (the mesh
// checked that they can), every other pair is between hosts. The mesh is the same on every
// rank, so every rank derives the same topology.
Topology topology_of(const Mesh& mesh, int size) {
  std::vector<int64_t> labels(size);
  for (int r = 0; r < size; ++r) {
    labels[r] = r;
    for (int q = 0; q < r; ++q)
      if (!mesh.pair_uses_tcp(r, q)) {
        labels[r] = labels[q];
        break;
      }
  }
  return Topology::from_labels(labels);
}

int online_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

std::string host_identity() {
  std::string h = setting_str(Setting::Hostname);
  if (!h.empty()) return h;
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

Algo parse_algo_setting() {
  std::string v = setting_str(Setting::Algo);
  if (v == "auto") return Algo::Auto;
  if (v == "ring") return Algo::Ring;
  if (v == "tree") return Algo::Tree;
  if (v == "direct") return Algo::Direct;
  if (v == "oneshot") return Algo::OneShot;
  if (v == "hier") return Algo::Hier;
  if (v == "hier_tree") return Algo::HierTree;
  if (v == "rank_order") return Algo::RankOrder;
  RT_THROW(InvalidArgument,
           "RINGTREE_ALGO must be auto, ring, tree, direct, oneshot, hier, hier_tree or rank_order, got '", v, "'");
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(int rank, int size, const UniqueId& uid, double timeout_s) {
  return std::make_shared<CommunicatorImpl>(rank, size, uid, timeout_s);
}

CommunicatorImpl::CommunicatorImpl(int rank, int size, const UniqueId& uid, double timeout_s)
    : rank_(rank),
      size_(size),
      uid_(uid),
      default_timeout_(timeout_s),
      exec_(rank, size, ctrl_),
      recorder_(static_cast<size_t>(std::max<int64_t>(0, FlightRecorderCalls()))) {
  RT_CHECK(timeout_s > 0, InvalidArgument, "timeout must be positive, got ", timeout_s);
  parse_algo_setting();        // a bad RINGTREE_ALGO fails here, before bootstrap
  stream_bytes_setting();      // and a bad RINGTREE_STREAM_BYTES
  kernel_isa_name();           // a bad RINGTREE_KERNEL_ISA fails here, not inside a collective
  tcp_settings();              // and a bad TCP setting, before bootstrap
  shm_stream_store_setting();  // and a bad RINGTREE_SHM_STREAM_STORES
  const std::string transport = setting_str(Setting::Transport);
  RT_CHECK(transport == "auto" || transport == "tcp", InvalidArgument, "RINGTREE_TRANSPORT must be auto or tcp, got '",
           transport, "'");

  Bootstrap boot(rank, size, uid, timeout_s);
  uint32_t cpu_count = 0;
  const uint64_t cpu_domain = cpu_sharing_domain(&cpu_count);
  mesh_ = boot.connect(host_identity(), transport == "tcp", shared_memory_domain(), cpu_domain, cpu_count);
  topo_ = topology_of(mesh_, size);
  p2p_send_seq_.assign(size, 0);
  p2p_recv_seq_.assign(size, 0);
  // Local means what the probes found (topo_), not what the hostnames say. Ranks in other
  // namespaces or containers on this kernel may run on the same CPUs: count every rank allowed
  // exactly this rank's CPUs (emulated hosts here share the 2 cores, and each host's 2 ranks
  // alone would seem to fit them).
  WaitCounts counts;
  counts.local_ranks = counts.cpu_sharers = 0;
  for (int q = 0; q < size; ++q) {
    counts.local_ranks += topo_.same_host(q, rank);
    counts.cpu_sharers += mesh_.peers[q].cpu_domain == mesh_.peers[rank].cpu_domain;
  }
  counts.online_cpus = online_cpus();
  counts.cpus = cpu_count > 0 ? static_cast<int>(cpu_count) : counts.online_cpus;
  const uint64_t ring_bytes = std::max<uint64_t>(4096, static_cast<uint64_t>(ShmRingBytes()) & ~uint64_t{63});
  // Not the wait policy's verdict, which also counts ranks pinned to a core each (local ranks
  // above this process's CPUs): a copy there runs on a core of its own.
  const bool cores_shared = counts.cpu_sharers > counts.cpus;
  exec_.connect(boot, mesh_, uid_, ring_bytes, static_cast<uint64_t>(std::max<int64_t>(0, OneshotBytes())),
                cores_shared);
  ctrl_.attach(rank, mesh_);
  std::vector<std::string> names;
  for (int q = 0; q < size; ++q) names.push_back(ctrl_.who(q));
  messenger_.start(rank, mesh_, std::move(names), timeout_s);
  setup_choice(boot);
  const ClockOffset clock = boot.estimate_clock_offset(&FlightRecorder::now_ns);
  set_clock_offset(clock.offset_ns, clock.error_ns);
  // A shrink retried after a failed set-up needs every member to have failed it, not some.
  boot.confirm_setup();
  boot.close_star();
  dump_source_ = register_dump_source(
      [this](const std::string& reason) { return std::make_pair(dump_file_name(), dump_json(reason)); });

  counts.spin_us = SpinMicros() >= 0 ? SpinMicros() : -1;
  counts.yield_us = YieldMicros() >= 0 ? YieldMicros() : -1;
  const WaitDecision wait = decide_wait_policy(counts);
  exec_.set_wait_policy(wait.policy);
  wait_policy_ = wait.text;
}

CommunicatorImpl::~CommunicatorImpl() {
  try {
    close();
  } catch (...) {
  }
  unregister_dump_source(dump_source_);
}

std::string CommunicatorImpl::id() const { return mesh_.public_id; }

std::string CommunicatorImpl::dump_json(const std::string& reason) const {
  std::vector<int> sends, recvs;
  exec_.waiting_on(sends, recvs);
  bool aborted;
  std::string abort_reason;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    aborted = aborted_;
    abort_reason = abort_reason_;
  }
  return str_cat("{\"format\": \"ringtree-flight-recorder/1\", \"comm_id\": ", json_string(id()), ", \"rank\": ", rank_,
                 ", \"size\": ", size_, ", \"pid\": ", static_cast<int>(getpid()),
                 ", \"host\": ", json_string(mesh_.peers[rank_].host), ", \"reason\": ", json_string(reason),
                 ", \"dumped_ns\": ", FlightRecorder::now_ns(),
                 ", \"clock\": {\"offset_ns\": ", clock_offset_ns_.load(), ", \"error_ns\": ", clock_error_ns_.load(),
                 "}, \"capacity\": ", recorder_.capacity(), ", \"recorded\": ", recorder_.recorded(),
                 ", \"aborted\": ", aborted, ", \"abort_reason\": ", json_string(abort_reason),
                 ", \"calls\": ", recorder_.calls_json(sends, recvs), "}\n");
}

std::string CommunicatorImpl::dump_file_name() const { return str_cat("ringtree-", id(), "-rank", rank_, ".json"); }

void CommunicatorImpl::dump_to_setting(const std::string& reason) const {
  const std::string dir = dump_dir_setting();
  if (dir.empty()) return;
  try {
    const std::string path = write_dump_file(dir, dump_file_name(), dump_json(reason));
    std::fprintf(stderr, "ringtree: rank %d: flight recorder dumped to %s\n", rank_, path.c_str());
  } catch (const std::exception& failure) {
    std::fprintf(stderr, "ringtree: rank %d: the flight recorder dump failed: %s\n", rank_, failure.what());
  }
}

std::string CommunicatorImpl::address() const {
  const std::string& ip = rank_ < static_cast<int>(mesh_.peers.size()) ? mesh_.peers[rank_].ip : std::string();
  return ip.empty() ? uid_.ip : ip;
}

// Rank 0 measures (or reads its host's cache) and every rank adopts its figures: choices
// must agree on every rank, and a per-rank measurement would not.
void CommunicatorImpl::setup_choice(Bootstrap& boot) {
  MachineCosts costs;
  if (rank_ == 0) {
    const std::string model = setting_str(Setting::CostModel);
    RT_CHECK(model == "measure" || model == "defaults", InvalidArgument,
             "RINGTREE_COST_MODEL must be measure or defaults, got '", model, "'");
    costs = model == "defaults" ? MachineCosts{} : measure_machine(host_identity());
    if (costs.measured == 0) costs.cores = online_cpus();
    costs.local_ranks = 0;
    for (int q = 0; q < size_; ++q) costs.local_ranks += mesh_.peers[q].host == mesh_.peers[0].host;
    costs.any_tcp = size_ > 1 && !mesh_.no_pair_uses_tcp();
    costs.tcp_hop_s = std::max<int64_t>(1, TcpHopMicros()) * 1e-6;
    costs.tcp_Bps = std::max<int64_t>(1, TcpMBps()) * 1e6;
  }
  static_assert(std::is_trivially_copyable_v<MachineCosts>, "sent as bytes");
  boot.broadcast_from_root(&costs, sizeof(costs));
  // Rank 0's figures, so every rank lowers a broadcast's segments alike.
  exec_.set_last_level_cache_bytes(static_cast<uint64_t>(costs.l3_bytes));
  ChoiceSetup setup;
  setup.nranks = size_;
  setup.topology = topo_;
  setup.costs = costs;
  setup.oneshot_bytes = exec_.oneshot_capacity();
  setup.forced = parse_algo_setting();
  choice_.configure(setup);
}

CommStatus CommunicatorImpl::status() const {
  CommStatus s;
  for (int q = 0; q < size_; ++q) s.transports.push_back(exec_.transport_to(q));
  s.hosts = topo_.describe();
  s.wait_policy = wait_policy_;
  s.single_copy = exec_.single_copy_status();
  s.numa = exec_.numa_status();
  s.numa_nodes = exec_.numa_nodes();
  s.shm_stores = exec_.shm_stores();
  const MachineCosts& m = choice_.costs();
  s.cost_source = m.measured == 1   ? "measured"
                  : m.measured == 2 ? "cached"
                  : m.measured == 3 ? "measured (busy)"
                                    : "defaults";
  s.machine = {{"call_us", m.call_s * 1e6},
               {"hop_us", m.hop_s * 1e6},
               {"switch_us", m.switch_s * 1e6},
               {"copy_hot_GBps", m.copy_hot_Bps / 1e9},
               {"copy_cold_GBps", m.copy_cold_Bps / 1e9},
               {"reduce_hot_GBps", m.reduce_hot_Bps / 1e9},
               {"reduce_cold_GBps", m.reduce_cold_Bps / 1e9},
               {"l2_KiB", m.l2_bytes / 1024},
               {"l3_KiB", m.l3_bytes / 1024},
               {"cores", m.cores},
               {"local_ranks", m.local_ranks},
               {"any_tcp", m.any_tcp},
               {"tcp_hop_us", m.tcp_hop_s * 1e6},
               {"tcp_GBps", m.tcp_Bps / 1e9}};
  s.algo_hook = choice_.has_hook();
  s.shared_cpu_waits = exec_.shared_cpu_waits();
  s.single_copy_messages = exec_.single_copy_messages();
  s.streamed_pieces = exec_.streamed_pieces();
  s.broadcast_asks_root = exec_.broadcast_asks_root();
  return s;
}

Prepared CommunicatorImpl::prepare(const CollectiveArgs& a) const {
  Prepared p;
  p.validated = validate_call(a, rank_, size_);
  p.args = a;
  p.timeout_s = a.timeout_s > 0 ? a.timeout_s : default_timeout_;
  p.algo = choose_algo(a.coll, a.algo, p.validated.count * dtype_size(a.dtype), a.dtype, a.op, deterministic_mode(a));
  return p;
}

// A call of a collective whose every rank holds the same count N, with N = 0: nothing to send,
// receive or compute. Point-to-point calls (a zero-length message still matches a receive),
// all_to_all_v (a rank's counts say nothing of its peers'), barriers and gated calls run.
bool CommunicatorImpl::moves_nothing(const Prepared& p) {
  const Collective c = p.args.coll;
  return p.validated.count == 0 && !p.args.ready && !collective_traits(c).point_to_point && c != Collective::Barrier &&
         c != Collective::AllToAllV;
}

void CommunicatorImpl::order_call(Prepared& p) {
  switch (p.args.coll) {
    case Collective::Send:
      p.seq = p2p_send_seq_[p.args.peer]++;
      break;
    case Collective::Recv:
      p.seq = p2p_recv_seq_[p.args.peer]++;
      break;
    case Collective::SendRecv:
      p.seq = p2p_send_seq_[p.args.peer]++;
      p.recv_seq = p2p_recv_seq_[p.args.recv_peer]++;
      break;
    default:
      if (p.asks_root) p.ask_seq = next_seq_++;
      p.seq = next_seq_++;
      break;
  }
  p.record = recorder_.open(p.args.coll, p.args.dtype, p.args.op, p.algo, is_rooted(p.args.coll) ? p.args.root : -1,
                            p.args.peer, p.args.recv_peer, p.validated.count, label_.load(std::memory_order_relaxed),
                            p.seq, p.recv_seq);
}

std::shared_ptr<Work> CommunicatorImpl::run(const CollectiveArgs& args, bool async) {
  // Collected, as issued, when this thread opened a group (a group is the calls of the thread
  // that started it, as NCCL's are); group_end() checks and runs them. Only that thread touches
  // the list, so collecting a call takes no lock, and a call that repeats the kept group's is
  // compared, not copied (runtime/batch.cc): a group of small calls costs little more than one.
  if (group_depth_.load(std::memory_order_relaxed) > 0 && std::this_thread::get_id() == group_owner_)
    return collect_group_call(args, async);
  return run_now(args, async);
}

std::shared_ptr<Work> CommunicatorImpl::run_now(const CollectiveArgs& args, bool async) {
  RT_CHECK(async || !args.ready, InvalidArgument, collective_name(args.coll),
           ": a call that waits for its input (a gate) is always async");
  Prepared p = prepare(args);
  // Not a gated call: its root's buffer may not be in place until the gate opens.
  if (args.coll == Collective::Broadcast && !args.ready && (p.algo == Algo::Tree || p.algo == Algo::Ring) &&
      choice_.cost_model_chooses(args.algo)) {
    const auto [from, below] = exec_.broadcast_asks_root();
    const uint64_t bytes = p.validated.count * dtype_size(args.dtype);
    p.asks_root = bytes >= from && bytes < below;
  }
  std::unique_lock<std::mutex> lock(queue_mu_);
  if (closed_) RT_THROW(Aborted, "the communicator is closed");
  if (aborted_) RT_THROW(Aborted, "the communicator was aborted by an earlier error: ", abort_reason_);
  order_call(p);
  if (moves_nothing(p)) {
    // Checked like any call (above), then it takes its place in the order and returns: no
    // traffic, as MPI does. Its sequence number is spent, so a peer that made a call with data
    // here meets this rank's next call and raises CollectiveMismatch (docs/getting-started.md).
    skipped_.coll = p.args.coll;
    skipped_.dtype = p.args.dtype;
    skipped_.op = is_reduction(p.args.coll) ? static_cast<uint8_t>(p.args.op) : Fingerprint::kNoOp;
    skipped_.root = is_rooted(p.args.coll) ? p.args.root : -1;
    skipped_.algo = p.algo;
    skipped_.seq = p.seq;
    any_skipped_ = true;
    lock.unlock();
    recorder_.started(p.record, true);
    recorder_.finished(p.record, nullptr);
    if (!async) return nullptr;
    auto work = std::make_shared<Work>();
    work->finish(nullptr);
    return work;
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
  p.starts_at_once = queue_.empty() && !worker_busy_;
  if (!p.starts_at_once) queue_cv_.wait(lock, [this] { return queue_.empty() && !worker_busy_; });
  lock.unlock();
  std::lock_guard<std::mutex> exec(exec_mu_);
  execute(p);
  return nullptr;
}

// The root says whether its buffer lies mostly on huge pages, in a one-byte broadcast of its own
// sequence number, and every rank runs the flat tree if it does.
void CommunicatorImpl::ask_root_pages(Prepared& p) {
  const uint64_t bytes = p.validated.count * dtype_size(p.args.dtype);
  // No where the kernel cannot say: the binary tree, as before.
  uint8_t huge = rank_ == p.args.root && cma_source_on_huge_pages(p.validated.input.ptr, bytes).value_or(false);
  CollectiveArgs a;
  a.coll = Collective::Broadcast;
  a.dtype = DataType::Uint8;
  a.root = p.args.root;
  a.timeout_s = p.timeout_s;
  a.input = a.output = Buffer{&huge, 1, false, true};
  Prepared ask = prepare(a);
  ask.seq = p.ask_seq;
  ask.starts_at_once = p.starts_at_once;
  ask.is_ask = true;
  try {
    execute(ask);
  } catch (const Error& e) {
    recorder_.finished(p.record, &e);
    throw;
  }
  if (huge) p.algo = Algo::Direct;
  recorder_.set_algo(p.record, p.algo);
}

void CommunicatorImpl::execute(Prepared& p, const CallPlan* plan) {
  if (p.asks_root && !plan) ask_root_pages(p);
  const uint64_t segment =
      plan ? 0 : exec_.segment_bytes_for(p.args.coll, p.algo, p.validated.count * dtype_size(p.args.dtype));
  const HostCall call{plan ? *plan
                           : lower(p.args, p.validated, rank_, size_, p.algo, p.timeout_s, segment, &topo_,
                                   HostExecutor::kStagesInSchedule),
                      &p.args, p.seq, p.recv_seq};
  ctrl_.reset_notice_raised();
  recorder_.started(p.record, p.starts_at_once);
  try {
    try {
      if (aborted_) RT_THROW(Aborted, "the communicator was aborted by an earlier error: ", abort_reason_);
      ctrl_.raise_notice_if_any();
    } catch (const Error& e) {  // the reason names the call that failed, or comm.abort(): name this one too
      throw_error(e.kind(), str_cat(describe(call.plan.fingerprint(p.seq)), " on rank ", rank_, ": ", e.what()));
    }
    // Its input is still being produced (device data on their way to the host): the call
    // already holds its place in the order, and its traffic waits for the data.
    if (p.args.ready) {
      const std::string what = describe(call.plan.fingerprint(p.seq));
      bool opened = false;
      try {
        opened = p.args.ready->wait_open(p.timeout_s);
      } catch (const Error& e) {
        RT_THROW(Error, what, " failed on rank ", rank_, ": its input could not be staged: ", e.what());
      }
      RT_CHECK(opened, Timeout, what, " timed out on rank ", rank_, " after ", p.timeout_s,
               " s waiting for its own input: the stream it was issued on did not reach it");
    }
    exec_.run(call);
    if (!collective_traits(p.args.coll).point_to_point) ran_through_ = p.seq + 1;
  } catch (const CollectiveMismatch& e) {
    // The peer's call may be meant to pair with a count-0 call this rank made and sent nothing
    // for: say so, or the message names only the calls after it.
    std::string note;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (any_skipped_ && skipped_.seq >= ran_through_ && skipped_.seq < p.seq)
        note = str_cat("; before it this rank made ", describe(skipped_),
                       ", which moves nothing and was compared with no peer");
    }
    // A broadcast that asks its root first made a call the user did not: say which (once, where a
    // peer's text says it already).
    if (p.asks_root || p.is_ask) {
      const std::string asked = str_cat(
          "; broadcast #", p.is_ask ? p.seq : p.ask_seq, " (one uint8) is broadcast #", p.is_ask ? p.seq + 1 : p.seq,
          " asking its root where its buffer lies, as a broadcast ", "this large does where ranks outnumber cores");
      if (std::string(e.what()).find(asked) == std::string::npos) note += asked;
    }
    if (note.empty()) fail(p, e);
    try {
      throw_error(e.kind(), e.what() + note);
    } catch (const Error& noted) {
      fail(p, noted);
    }
  } catch (const Aborted& e) {
    recorder_.finished(p.record, &e);
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!aborted_) {  // a peer's abort() reached this rank in this call
      abort_reason_ = e.what();
      aborted_ = true;
    }
    throw;
  } catch (const Error& e) {
    fail(p, e);
  }
  recorder_.finished(p.record, nullptr);
}

void CommunicatorImpl::fail(Prepared& p, const Error& e) {
  recorder_.finished(p.record, &e);
  // A failure a peer reported has been told to everyone already.
  if (!ctrl_.notice_raised()) ctrl_.broadcast_abort(e.kind(), p.seq, e.what());
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    abort_reason_ = e.what();
    aborted_ = true;
  }
  dump_to_setting(error_kind_name(e.kind()));
  throw_error(e.kind(), e.what());
}

void CommunicatorImpl::abort(const std::string& why) {
  const std::string text = str_cat("comm.abort() on rank ", rank_, why.empty() ? "" : ": ", why);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (closed_) return;
    if (!aborted_) {
      abort_reason_ = text;
      aborted_ = true;
    }
  }
  ctrl_.broadcast_abort(ErrorKind::Aborted, 0, text);  // every peer's call in flight ends too
  exec_.abort(text);
  messenger_.abort(text);
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
      if (job.batch)
        run_batch(*job.batch);
      else
        execute(job.prepared);
    } catch (...) {
      error = std::current_exception();
    }
    if (job.batch) job.batch->running.store(false);
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
  messenger_.close(default_timeout_);  // queued messages go out first
  std::lock_guard<std::mutex> exec(exec_mu_);
  ctrl_.goodbye_and_close();
  exec_.close();
  if (DumpOnExit()) dump_to_setting("exit");
}

}  // namespace ringtree
