// Grouped and persistent calls. Both become a Batch: calls validated and chosen once, lowered at
// their first run, and run by the communicator as one job in its call order.
//
// Terms. The group's calls are what the user issued between group_start() and group_end(); its
// items are what runs: a fused all_reduce (several small all_reduces of one dtype, op and mode,
// packed into one staging buffer, reduced by one call and unpacked), a single call, or a send and
// a receive paired into one sendrecv. Items run in an order every rank derives alike: the
// collectives in issue order (a fused item at its first member's place), then the sends and
// receives. Before a group runs, one all_gather of each rank's (count, hash) of its collectives
// checks that every rank issued the same ones; only when they differ does a second all_gather of
// every call's description find the first call that differs, so that every rank names it. A
// small first all_reduce rides that all_gather: each rank reduces the gathered data itself, so a
// group of small all_reduces costs one exchange. A group that issues the kept group's calls
// again is only compared with it, call by call, as it is issued.
#include <algorithm>
#include <cstring>
#include "common/check.h"
#include "common/hash.h"
#include "runtime/communicator_impl.h"

namespace ringtree {

namespace {

// Larger all_reduces gain nothing from fusing (their bandwidth term dominates) and run alone.
constexpr uint64_t kFuseCallBytes = uint64_t{64} << 10;
constexpr uint64_t kFuseItemBytes = uint64_t{4} << 20;
constexpr int kDescribeWords = 8;  // one call in the mismatch exchange: present + the fingerprint
// One rank's block in the check's all_gather: the summary (the count and hash of the group's
// collectives, the riding item's element count or 0, a pad word) and room for that item's data.
// Its size is fixed, never taken from the group, so that groups which differ still exchange the
// same count and the check, not a fingerprint, names the call that differs.
constexpr uint64_t kCheckWords = 128;
constexpr uint64_t kSummaryWords = 4;
constexpr uint64_t kRideBytes = (kCheckWords - kSummaryWords) * 8;

// The first item rides the check when the check can give its exact result: an all_reduce whose
// reduction is one elementwise op folded in rank order (the one-shot and rank_order bits).
bool can_ride(const BatchItem& it) {
  const CollectiveArgs& a = it.call.args;
  const uint64_t bytes = it.call.validated.count * dtype_size(a.dtype);
  return a.coll == Collective::AllReduce && a.op != ReduceOp::Avg && a.op != ReduceOp::PremulSum && bytes > 0 &&
         bytes <= kRideBytes;
}

// Copies of a member's few bytes, inlined for the sizes small calls have.
inline void copy_small(void* dst, const void* src, size_t n) {
  switch (n) {
    case 4:
      std::memcpy(dst, src, 4);
      break;
    case 8:
      std::memcpy(dst, src, 8);
      break;
    case 16:
      std::memcpy(dst, src, 16);
      break;
    default:
      std::memcpy(dst, src, n);
  }
}

uint64_t bytes_of(const Prepared& p) { return p.validated.count * dtype_size(p.args.dtype); }

bool fusable(const CollectiveArgs& a, uint64_t bytes) {
  return a.coll == Collective::AllReduce && a.algo == Algo::Auto && bytes > 0 && bytes <= kFuseCallBytes;
}

// Calls one all_reduce can stand for: the same elementwise reduction with the same limits.
bool fuse_together(const Prepared& a, const CollectiveArgs& b, double timeout_s) {
  return a.args.dtype == b.dtype && a.args.op == b.op && a.args.premul_factor == b.premul_factor &&
         a.args.deterministic == b.deterministic && a.timeout_s == timeout_s;
}

// A call as issued, for the group check: every field of its fingerprint but the sequence
// number, with the algorithm as asked (auto resolves alike on every rank from these fields).
Fingerprint issued_fingerprint(const CollectiveArgs& a, const CollectiveTraits& t, uint64_t count, bool det_setting) {
  Fingerprint f;
  f.coll = a.coll;
  f.dtype = a.coll == Collective::Barrier ? DataType::Int8 : a.dtype;
  f.op = t.reduction ? static_cast<uint8_t>(a.op) : Fingerprint::kNoOp;
  f.algo = a.algo;
  f.root = t.rooted ? a.root : -1;
  f.count = count;
  f.deterministic = t.reduction && (a.deterministic || det_setting);
  return f;
}

// The group hash: a word-wise multiply-xorshift over each call's fingerprint packed in three
// words. Every rank computes it alike; a difference it misses is still caught by the calls'
// own fingerprints as they run, only named less well.
uint64_t hash_issued(uint64_t h, const Fingerprint& f) {
  const uint64_t words[3] = {static_cast<uint64_t>(f.coll) | static_cast<uint64_t>(f.dtype) << 8 |
                                 static_cast<uint64_t>(f.op) << 16 | static_cast<uint64_t>(f.algo) << 24 |
                                 static_cast<uint64_t>(f.deterministic) << 32,
                             static_cast<uint32_t>(f.root), f.count};
  for (uint64_t w : words) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  return h;
}

void to_words(const Fingerprint& f, uint64_t* w) {
  w[0] = 1;
  w[1] = static_cast<uint64_t>(f.coll);
  w[2] = static_cast<uint64_t>(f.dtype);
  w[3] = f.op;
  w[4] = static_cast<uint64_t>(f.algo);
  w[5] = static_cast<uint64_t>(static_cast<int64_t>(f.root));
  w[6] = f.count;
  w[7] = f.deterministic;
}

Fingerprint from_words(const uint64_t* w) {
  Fingerprint f;
  f.coll = static_cast<Collective>(w[1]);
  f.dtype = static_cast<DataType>(w[2]);
  f.op = static_cast<uint8_t>(w[3]);
  f.algo = static_cast<Algo>(w[4]);
  f.root = static_cast<int32_t>(static_cast<int64_t>(w[5]));
  f.count = w[6];
  f.deterministic = w[7] != 0;
  return f;
}

// describe() without the sequence number, which a call in a group does not have yet.
std::string describe_issued(const Fingerprint& f) {
  std::string d = describe(f);
  const size_t hash = d.find(" #");
  if (hash != std::string::npos) d.erase(hash, d.find(' ', hash + 1) - hash);
  return d;
}

}  // namespace

std::shared_ptr<Batch> CommunicatorImpl::make_batch(const std::vector<CollectiveArgs>& calls, bool group) {
  auto b = std::make_shared<Batch>(shared_from_this());
  uint64_t hash = kFnvOffset;
  std::vector<Prepared> sends, recvs;
  std::vector<BatchItem>& items = b->items;
  b->issued.reserve(calls.size());
  // The fused item the last fusable call joined (the next most likely joins it too), its bytes.
  size_t fusing = SIZE_MAX;
  uint64_t fusing_bytes = 0;
  const bool det_setting = deterministic_setting();
  for (size_t i = 0; i < calls.size(); ++i) {
    const CollectiveArgs& a = calls[i];
    ValidatedCall v;
    try {
      v = validate_call(a, rank_, size_);
    } catch (const Error& e) {
      if (!group) throw;
      throw_error(e.kind(), str_cat("in a group, its call ", i, ": ", e.what()));
    }
    const double timeout_s = a.timeout_s > 0 ? a.timeout_s : default_timeout_;
    const Collective c = a.coll;
    if (c == Collective::Send || c == Collective::Recv) {
      Prepared& p = (c == Collective::Send ? sends : recvs).emplace_back();
      p.args = a;
      p.validated = v;
      p.timeout_s = timeout_s;
      continue;
    }
    const CollectiveTraits& t = collective_traits(c);
    if (!t.point_to_point) {
      b->issued.push_back(issued_fingerprint(a, t, v.count, det_setting));
      hash = hash_issued(hash, b->issued.back());
    }
    const uint64_t bytes = v.count * dtype_size(a.dtype);
    if (fusable(a, bytes)) {
      auto joins = [&](const BatchItem& it, uint64_t it_bytes) {
        return !it.members.empty() && fuse_together(it.call, a, timeout_s) && it_bytes + bytes <= kFuseItemBytes;
      };
      if (fusing == SIZE_MAX || !joins(items[fusing], fusing_bytes)) {
        auto into =
            std::find_if(items.begin(), items.end(), [&](const BatchItem& it) { return joins(it, bytes_of(it.call)); });
        fusing = into == items.end() ? SIZE_MAX : static_cast<size_t>(into - items.begin());
        if (fusing != SIZE_MAX) fusing_bytes = bytes_of(into->call);
      }
      if (fusing != SIZE_MAX) {
        BatchItem& it = items[fusing];
        it.members.push_back({v.input, v.output, fusing_bytes});
        it.call.validated.count += v.count;
        fusing_bytes += bytes;
        continue;
      }
      fusing = items.size();
      fusing_bytes = bytes;
      items.emplace_back();
      items.back().members.reserve(calls.size() - i);
      items.back().members.push_back({v.input, v.output, 0});
    } else {
      items.emplace_back();
    }
    Prepared& p = items.back().call;
    p.args = a;
    p.validated = v;
    p.timeout_s = timeout_s;
  }
  // Sends and receives after the collectives: the k-th send with the k-th receive as one
  // sendrecv (both directions progress together, as a grouped exchange needs), the rest alone.
  const size_t pairs = std::min(sends.size(), recvs.size());
  for (size_t k = 0; k < std::max(sends.size(), recvs.size()); ++k) {
    items.emplace_back();
    Prepared& p = items.back().call;
    if (k < pairs && sends[k].args.dtype == recvs[k].args.dtype) {
      p = std::move(sends[k]);
      p.args.coll = Collective::SendRecv;
      p.args.output = recvs[k].args.output;
      p.args.recv_peer = recvs[k].args.peer;
      p.timeout_s = std::max(p.timeout_s, recvs[k].timeout_s);
      p.validated = validate_call(p.args, rank_, size_);
    } else {
      if (k < sends.size()) p = std::move(sends[k]);
      if (k < recvs.size()) {
        if (k < sends.size()) items.emplace_back();
        items.back().call = std::move(recvs[k]);
      }
    }
  }
  // A fused item of one call runs as that call; the others reduce in place in the staging buffer.
  uint64_t staging_bytes = 0;
  for (BatchItem& it : items) {
    if (it.members.size() == 1) it.members.clear();
    if (!it.members.empty()) staging_bytes += (bytes_of(it.call) + 63) & ~uint64_t{63};
  }
  uint8_t* staging = staging_bytes ? b->staging.ensure(staging_bytes) : nullptr;
  for (BatchItem& it : items) {
    if (!it.members.empty()) {
      CollectiveArgs& a = it.call.args;
      a.input = Buffer{staging, it.call.validated.count, false, true};
      a.output = a.input;
      it.call.validated = validate_call(a, rank_, size_);
      staging += (bytes_of(it.call) + 63) & ~uint64_t{63};
    }
    const CollectiveArgs& a = it.call.args;
    it.call.algo = choose_algo(a.coll, a.algo, bytes_of(it.call), a.dtype, a.op, deterministic_mode(a));
  }
  b->issued_hash = hash;
  b->check_pending = group && !b->issued.empty();
  if (b->check_pending) {
    b->check_mine.assign(kCheckWords, 0);
    b->check_all.assign(kCheckWords * size_, 0);
    b->check_rides = can_ride(items.front());
  }
  return b;
}

namespace {

// Field by field, the buffers first (what differs most often between two groups), the
// all_to_all_v counts last and only where some are given: a group compares every call it repeats.
inline bool same_call(const CollectiveArgs& a, const CollectiveArgs& b) {
  auto same_buffer = [](const Buffer& x, const Buffer& y) {
    return x.ptr == y.ptr && x.count == y.count && x.readonly == y.readonly && x.present == y.present;
  };
  return same_buffer(a.input, b.input) && same_buffer(a.output, b.output) && a.coll == b.coll && a.dtype == b.dtype &&
         a.op == b.op && a.root == b.root && a.peer == b.peer && a.recv_peer == b.recv_peer && a.algo == b.algo &&
         a.deterministic == b.deterministic && a.premul_factor == b.premul_factor && a.timeout_s == b.timeout_s &&
         a.ready == b.ready &&
         ((a.send_counts.empty() && b.send_counts.empty() && a.recv_counts.empty() && b.recv_counts.empty()) ||
          (a.send_counts == b.send_counts && a.recv_counts == b.recv_counts));
}

}  // namespace

std::shared_ptr<Batch> CommunicatorImpl::group_batch(
    std::vector<CollectiveArgs>& calls, const std::shared_ptr<const std::vector<CollectiveArgs>>& matched) {
  std::lock_guard<std::mutex> lock(group_cache_mu_);
  // A batch depends on its calls' arguments alone (buffers by address, never their contents), so
  // the same calls make the same batch. One held elsewhere (an async group still queued or
  // running, another thread's group about to start) is not shared.
  if (matched && matched == cached_group_calls_ && cached_group_ && cached_group_.use_count() == 1)
    return cached_group_;
  if (!matched && cached_group_ && cached_group_.use_count() == 1 && calls.size() == cached_group_calls_->size() &&
      std::equal(calls.begin(), calls.end(), cached_group_calls_->begin(), same_call))
    return cached_group_;
  std::shared_ptr<Batch> b = make_batch(matched ? *matched : calls, true);
  b->check_every_run = true;
  b->comm_.reset();  // run by start_batch here, never by Request::start
  cached_group_ = b;
  coalesced_kept_ = false;
  cached_group_calls_ = matched ? matched : std::make_shared<const std::vector<CollectiveArgs>>(std::move(calls));
  return b;
}

void CommunicatorImpl::order_batch(Batch& b) {
  // A first item that rides the check runs as the check, in its place and under its record.
  const bool rides = b.check_pending && b.check_rides;
  if (b.check_pending && !rides) b.check_seq = next_seq_++;
  for (BatchItem& it : b.items) order_call(it.call);
  if (rides) b.check_seq = b.items.front().call.seq;
}

void CommunicatorImpl::fail_here(const Error& e) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!aborted_) {
      abort_reason_ = e.what();
      aborted_ = true;
    }
  }
  dump_to_setting(error_kind_name(e.kind()));
}

// One all_gather of (count, hash) of every rank's collectives, with the first item's data where
// it rides; where they differ, a second one of every call's description, from which every rank
// names the same first difference.
bool CommunicatorImpl::check_group(Batch& b) {
  auto all_gather_args = [&](const uint64_t* mine, uint64_t words, uint64_t* all) {
    CollectiveArgs a;
    a.coll = Collective::AllGather;
    a.dtype = DataType::Int64;
    a.input = Buffer{const_cast<uint64_t*>(mine), words, true, true};
    a.output = Buffer{all, words * size_, false, true};
    return a;
  };
  uint64_t* mine = b.check_mine.data();
  const uint64_t* all = b.check_all.data();
  const Prepared& first = b.items.front().call;
  const uint64_t ride_bytes = b.check_rides ? bytes_of(first) : 0;
  // The riding count is in the summary: calls whose timeouts differ can fuse differently on two
  // ranks with the same hash, and a rank must never fold a block packed for another count.
  mine[0] = b.issued.size();
  mine[1] = b.issued_hash;
  mine[2] = b.check_rides ? first.validated.count : 0;
  // Its input: the fused item's staging (run_batch packed it) or the single call's own buffer.
  if (ride_bytes) std::memcpy(mine + kSummaryWords, first.validated.input.ptr, ride_bytes);
  if (!b.check_lowered) {
    b.check_call = prepare(all_gather_args(mine, kCheckWords, b.check_all.data()));
    const Prepared& c = b.check_call;
    const uint64_t segment = exec_.segment_bytes_for(c.args.coll, c.algo, bytes_of(c));
    b.check_plan =
        lower(c.args, c.validated, rank_, size_, c.algo, c.timeout_s, segment, &topo_, HostExecutor::kStagesInSchedule);
    b.check_lowered = true;
  }
  Prepared& check = b.check_call;
  check.seq = b.check_seq;
  check.record = b.check_rides ? first.record : 0;
  check.starts_at_once = b.check_rides && first.starts_at_once;
  execute(check, &b.check_plan);
  bool same = true;
  for (int r = 0; r < size_; ++r) same = same && std::equal(mine, mine + kSummaryWords, all + r * kCheckWords);
  if (same) {
    if (!b.check_rides) return false;
    // ((x0 op x1) op x2) ... in rank order, as the one-shot and rank_order schedules reduce, into
    // the item's output (run_batch unpacks a fused item's members from there, as after a call).
    const uint64_t count = first.validated.count;
    auto* result = static_cast<uint8_t*>(first.validated.output.ptr);
    auto block = [&](int r) { return reinterpret_cast<const uint8_t*>(all + r * kCheckWords + kSummaryWords); };
    if (size_ == 1) {
      std::memcpy(result, block(0), ride_bytes);
    } else {
      const ReduceFn reduce = reduce_fn(first.args.dtype, first.args.op);
      reduce(result, block(0), block(1), count);
      for (int r = 2; r < size_; ++r) reduce(result, result, block(r), count);
    }
    return true;
  }
  uint64_t most = 0;
  for (int r = 0; r < size_; ++r) most = std::max(most, all[r * kCheckWords]);
  const uint64_t words = most * kDescribeWords;
  std::vector<uint64_t> described(words, 0), table(words * size_);
  for (size_t i = 0; i < b.issued.size(); ++i) to_words(b.issued[i], &described[i * kDescribeWords]);
  Prepared describe_call = prepare(all_gather_args(described.data(), words, table.data()));
  describe_call.seq = b.check_seq;
  execute(describe_call);
  auto row = [&](int r, uint64_t i) { return &table[r * words + i * kDescribeWords]; };
  auto text = [&](int r, uint64_t i) {
    return row(r, i)[0] ? describe_issued(from_words(row(r, i))) : std::string("nothing (its group ends before)");
  };
  for (uint64_t i = 0; i < most; ++i)
    for (int r = 1; r < size_; ++r)
      if (!std::equal(row(0, i), row(0, i) + kDescribeWords, row(r, i))) {
        const CollectiveMismatch e(str_cat("collective mismatch in a group: its call ", i, " is ", text(0, i),
                                           " on rank 0 but ", text(r, i), " on rank ", r));
        fail_here(e);
        throw e;
      }
  // The same calls, fused differently: only a per-call timeout, outside the fingerprint, differs.
  const CollectiveMismatch e(
      "collective mismatch in a group: every rank issued the same calls, but their timeouts differ between ranks, "
      "so the ranks would fuse them differently; give the calls of a group the same timeout on every rank");
  fail_here(e);
  throw e;
}

void CommunicatorImpl::run_batch(Batch& b) {
  const bool check = b.check_pending;
  b.check_pending = b.check_every_run;
  for (size_t i = 0; i < b.items.size(); ++i) {
    BatchItem& it = b.items[i];
    Prepared& p = it.call;
    auto* staging = static_cast<uint8_t*>(p.args.input.ptr);
    const size_t esz = dtype_size(p.args.dtype);
    for (const BatchItem::Member& m : it.members)
      if (m.input.ptr != staging + m.offset) copy_small(staging + m.offset, m.input.ptr, m.input.count * esz);
    // The check runs before the first item, or as it when that rides (check_group).
    if (i > 0 || !check || !check_group(b)) {
      if (!it.lowered) {
        const uint64_t segment = exec_.segment_bytes_for(p.args.coll, p.algo, bytes_of(p));
        it.plan = lower(p.args, p.validated, rank_, size_, p.algo, p.timeout_s, segment, &topo_,
                        HostExecutor::kStagesInSchedule);
        it.lowered = true;
      }
      execute(p, &it.plan);
    }
    for (const BatchItem::Member& m : it.members) copy_small(m.output.ptr, staging + m.offset, m.output.count * esz);
  }
}

std::shared_ptr<Work> CommunicatorImpl::start_batch(const std::shared_ptr<Batch>& b, bool async,
                                                    std::shared_ptr<Work> work) {
  RT_CHECK(!b->running.exchange(true), InvalidArgument,
           "start: this request is still running; wait for it before starting it again");
  struct Release {
    Batch* b;
    ~Release() {
      if (b) b->running.store(false);
    }
  } release{b.get()};
  std::unique_lock<std::mutex> lock(queue_mu_);
  if (closed_) RT_THROW(Aborted, "the communicator is closed");
  if (aborted_) RT_THROW(Aborted, "the communicator was aborted by an earlier error: ", abort_reason_);
  RT_CHECK(group_depth_.load() == 0, InvalidArgument, "start: a request cannot be started inside a group");
  order_batch(*b);
  if (async) {
    if (!work) work = std::make_shared<Work>();
    queue_.push_back({Prepared{}, work, b});
    release.b = nullptr;  // the worker lets go of it
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    queue_cv_.notify_all();
    return work;
  }
  if (!queue_.empty() || worker_busy_) queue_cv_.wait(lock, [this] { return queue_.empty() && !worker_busy_; });
  lock.unlock();
  std::lock_guard<std::mutex> exec(exec_mu_);
  run_batch(*b);
  return nullptr;
}

std::shared_ptr<Work> Batch::start(bool async) { return comm_->start_batch(shared_from_this(), async, nullptr); }

std::shared_ptr<Request> CommunicatorImpl::persistent(const CollectiveArgs& args) {
  RT_CHECK(!args.ready, InvalidArgument, collective_name(args.coll), ": a gated call cannot be persistent");
  return make_batch({args}, false);
}

void CommunicatorImpl::group_start() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (group_depth_.load() == 0) {
    group_owner_ = std::this_thread::get_id();
    group_args_.clear();
    {
      std::lock_guard<std::mutex> cache(group_cache_mu_);
      group_template_ = cached_group_calls_;
    }
    group_matching_ = group_template_ != nullptr;
    group_matched_ = 0;
  } else {
    RT_CHECK(group_owner_ == std::this_thread::get_id(), InvalidArgument,
             "group_start(): another thread has a group open on this communicator");
  }
  group_depth_.fetch_add(1);
}

std::shared_ptr<Work> CommunicatorImpl::collect_group_call(const CollectiveArgs& args, bool async) {
  RT_CHECK(!args.ready, InvalidArgument, collective_name(args.coll), ": a gated call cannot join a group");
  if (group_matching_) {
    if (group_matched_ < group_template_->size() && same_call(args, (*group_template_)[group_matched_])) {
      ++group_matched_;
      return async ? group_async_work() : nullptr;
    }
    group_args_.reserve(std::max(last_group_calls_, group_matched_ + 1));
    group_args_.assign(group_template_->begin(), group_template_->begin() + static_cast<ptrdiff_t>(group_matched_));
    group_matching_ = false;
  }
  group_args_.push_back(args);
  return async ? group_async_work() : nullptr;
}

namespace {

inline bool same_buffers(const Communicator::CallBuffers* a, size_t n,
                         const std::vector<Communicator::CallBuffers>& b) {
  if (n != b.size()) return false;
  for (size_t i = 0; i < n; ++i) {
    const Buffer &ai = a[i].input, &bi = b[i].input, &ao = a[i].output, &bo = b[i].output;
    if (ai.ptr != bi.ptr || ai.count != bi.count || ao.ptr != bo.ptr || ao.count != bo.count ||
        a[i].dtype != b[i].dtype || ai.readonly != bi.readonly || ao.readonly != bo.readonly ||
        ai.present != bi.present || ao.present != bo.present)
      return false;
  }
  return true;
}

}  // namespace

std::shared_ptr<Work> CommunicatorImpl::run_coalesced(const CollectiveArgs& common, const CallBuffers* buffers,
                                                      size_t n, bool async) {
  RT_CHECK(group_depth_.load() == 0, InvalidArgument,
           "a list of calls cannot run while a group is open on this communicator (on this thread or another); "
           "end the group first");
  RT_CHECK(!common.ready, InvalidArgument, collective_name(common.coll), ": a gated call cannot join a group");
  CollectiveArgs key = common;  // the calls' common part: their buffers are compared apart
  key.input = key.output = Buffer{};
  key.dtype = DataType{};
  std::shared_ptr<Batch> b;
  {
    std::lock_guard<std::mutex> lock(group_cache_mu_);
    if (n > 0 && coalesced_kept_ && cached_group_.use_count() == 1 && same_buffers(buffers, n, coalesced_buffers_) &&
        same_call(key, coalesced_common_))
      b = cached_group_;
  }
  if (!b && n > 0) {
    std::vector<CollectiveArgs> calls(n, common);
    for (size_t i = 0; i < n; ++i) {
      calls[i].input = buffers[i].input;
      calls[i].output = buffers[i].output;
      calls[i].dtype = buffers[i].dtype;
    }
    b = group_batch(calls, nullptr);  // a bad call throws here, naming its place, before any traffic
    std::lock_guard<std::mutex> lock(group_cache_mu_);
    if (cached_group_ == b) {
      coalesced_common_ = std::move(key);
      coalesced_buffers_.assign(buffers, buffers + n);
      coalesced_kept_ = true;
    }
  }
  return run_group_batch(b, async, async ? std::make_shared<Work>() : nullptr);
}

// A group's batch run as group_end() runs it (b null: an empty group), finishing `work`.
std::shared_ptr<Work> CommunicatorImpl::run_group_batch(const std::shared_ptr<Batch>& b, bool async,
                                                        std::shared_ptr<Work> work) {
  try {
    if (!b) {
      if (work) work->finish(nullptr);
      return async ? work : nullptr;
    }
    if (async) return start_batch(b, true, work);
    start_batch(b, false, nullptr);
  } catch (...) {
    if (work) work->finish(std::current_exception());
    throw;
  }
  if (work) work->finish(nullptr);
  return nullptr;
}

std::shared_ptr<Work> CommunicatorImpl::group_async_work() {
  if (!group_work_) group_work_ = std::make_shared<Work>();
  return group_work_;
}

bool CommunicatorImpl::in_group() const {
  return group_depth_.load() > 0 && group_owner_ == std::this_thread::get_id();
}

void CommunicatorImpl::group_discard() {
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    group_depth_.store(0);
    group_args_.clear();
    group_matching_ = false;
    group_template_.reset();
    work = std::move(group_work_);
  }
  if (work) work->finish(std::make_exception_ptr(Aborted("the group was discarded before it ran")));
}

// The open group's calls: the kept group's (`matched`) when every call repeated it, else `calls`.
void CommunicatorImpl::take_group_calls(std::vector<CollectiveArgs>& calls,
                                        std::shared_ptr<const std::vector<CollectiveArgs>>& matched) {
  if (group_matching_ && group_matched_ == group_template_->size()) {
    matched = std::move(group_template_);
  } else {
    if (group_matching_)
      group_args_.assign(group_template_->begin(), group_template_->begin() + static_cast<ptrdiff_t>(group_matched_));
    calls.swap(group_args_);
  }
  group_matching_ = false;
  group_template_.reset();
}

std::shared_ptr<Work> CommunicatorImpl::group_end(bool async) {
  std::vector<CollectiveArgs> calls;
  std::shared_ptr<const std::vector<CollectiveArgs>> matched;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    RT_CHECK(group_depth_.load() > 0, InvalidArgument, "group_end() without group_start()");
    if (group_depth_.fetch_sub(1) > 1) {  // an inner group: the outermost one runs it
      if (!async) return nullptr;
      if (!group_work_) group_work_ = std::make_shared<Work>();
      return group_work_;
    }
    take_group_calls(calls, matched);
    last_group_calls_ = matched ? matched->size() : calls.size();
    work = std::move(group_work_);
  }
  if (async && !work) work = std::make_shared<Work>();
  std::shared_ptr<Batch> b;
  try {
    if (matched || !calls.empty()) b = group_batch(calls, matched);
  } catch (const Error& e) {  // a bad call: nothing was sent, as for a discarded group
    if (work)
      work->finish(std::make_exception_ptr(Aborted(str_cat("the group was discarded before it ran: ", e.what()))));
    throw;
  }
  return run_group_batch(b, async, std::move(work));
}

std::shared_ptr<Request> CommunicatorImpl::group_end_persistent() {
  std::vector<CollectiveArgs> calls;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    RT_CHECK(group_depth_.load() == 1, InvalidArgument,
             "group_end_persistent() must end the outermost group, and only that one");
    group_depth_.store(0);
    std::shared_ptr<const std::vector<CollectiveArgs>> matched;
    take_group_calls(calls, matched);
    if (matched) calls = *matched;
    work = std::move(group_work_);
  }
  if (work) {
    const InvalidArgument e("a persistent group cannot hold async calls: start() it async instead");
    work->finish(std::make_exception_ptr(e));
    throw e;
  }
  return make_batch(calls, true);
}

}  // namespace ringtree
