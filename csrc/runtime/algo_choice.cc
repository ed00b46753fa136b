// The algorithm choice (see algo_choice.h for its rules).
#include "runtime/algo_choice.h"

#include <algorithm>
#include "common/check.h"

namespace ringtree {

void AlgoChoice::configure(const ChoiceSetup& setup) {
  RT_CHECK(setup.nranks >= 1, InvalidArgument, "a choice needs at least one rank, got ", setup.nranks);
  RT_CHECK(setup.topology.nranks() == 0 || setup.topology.nranks() == setup.nranks, InvalidArgument,
           "the topology has ", setup.topology.nranks(), " ranks, the choice ", setup.nranks);
  nranks_ = setup.nranks;
  topology_ = setup.topology.nranks() ? setup.topology : Topology::from_labels(std::vector<int64_t>(nranks_, 0));
  multi_host_ = topology_.num_hosts() > 1;
  costs_ = setup.costs;
  oneshot_bytes_ = setup.oneshot_bytes;
  forced_ = setup.forced;
  for (int c = 0; c < static_cast<int>(Collective::Count); ++c) {
    scheduled_[c] = supported_algos(static_cast<Collective>(c));
    weighed_[c].clear();
    for (Algo a : scheduled_[c])
      if (auto_weighs(static_cast<Collective>(c), a)) weighed_[c].push_back(a);
    hier_[c] = hier_algos(static_cast<Collective>(c));
  }
  // The schedules' counts depend only on P, the hosts and the segment setting (and the figures
  // weigh the links), so every rank builds the same table; choose() then prices from it without
  // allocating.
  prices_.build(nranks_, &topology_, link_weights(costs_));
  for (auto& entry : memo_) entry.store(0, std::memory_order_relaxed);
}

bool AlgoChoice::oneshot_fits(Collective coll, uint64_t bytes) const {
  return oneshot_bytes_ > 0 && oneshot_payload_bytes(coll, bytes, nranks_) <= oneshot_bytes_;
}

void AlgoChoice::set_hook(std::shared_ptr<ChoiceHook> hook) {
  std::atomic_store(&hook_, std::move(hook));
  for (auto& entry : memo_) entry.store(0, std::memory_order_relaxed);
}

std::vector<Algo> AlgoChoice::available(Collective coll, uint64_t bytes) const {
  std::vector<Algo> algos = weighed_[static_cast<int>(coll)];
  if (oneshot_fits(coll, bytes)) algos.push_back(Algo::OneShot);
  if (multi_host_)
    for (Algo a : hier_[static_cast<int>(coll)]) algos.push_back(a);
  return algos;
}

Algo AlgoChoice::choose_rank_order(Collective coll, Algo wanted, uint64_t bytes, DataType dtype, ReduceOp op) const {
  // Oneshot reduces in the same order; min and max may keep another zero or NaN when
  // the operands of a step come the other way round, so they stay on the chain.
  const bool oneshot = oneshot_fits(coll, bytes) && op != ReduceOp::Min && op != ReduceOp::Max;
  if (!oneshot) return Algo::RankOrder;
  if (wanted == Algo::OneShot) return Algo::OneShot;
  if (wanted != Algo::Auto) return Algo::RankOrder;
  return predict(costs_, prices_, coll, Algo::OneShot, bytes, dtype, nullptr) <
                 predict(costs_, prices_, coll, Algo::RankOrder, bytes, dtype, nullptr)
             ? Algo::OneShot
             : Algo::RankOrder;
}

void AlgoChoice::refuse(Collective coll, Algo requested, uint64_t bytes) const {
  std::string names;
  for (Algo a : available(coll, bytes)) names += std::string(algo_name(a)) + ", ";
  for (Algo a : scheduled_[static_cast<int>(coll)])
    if (!auto_weighs(coll, a)) names += std::string(algo_name(a)) + ", ";
  if (!multi_host_)
    for (Algo a : hier_[static_cast<int>(coll)]) names += std::string(algo_name(a)) + ", ";
  for (Algo a : rank_order_algos(coll)) names += std::string(algo_name(a)) + ", ";
  const uint64_t payload = oneshot_payload_bytes(coll, bytes, nranks_);
  if (requested == Algo::OneShot && payload != UINT64_MAX)
    RT_THROW(InvalidArgument, "algo 'oneshot' is not available for this ", collective_name(coll),
             ": it needs every rank", " on one host and at most ", oneshot_bytes_,
             " bytes per rank in the one-shot slots (RINGTREE_ONESHOT_BYTES); this call",
             oneshot_bytes_ > 0 ? str_cat(" puts ", payload, " there") : std::string(" spans hosts or uses TCP"),
             "; choose from ", names, "auto");
  RT_THROW(InvalidArgument, "algo '", algo_name(requested), "' is not available for ", collective_name(coll),
           "; choose from ", names, "auto");
}

uint64_t AlgoChoice::memo_key(Collective coll, uint64_t bytes, DataType dtype) {
  if (bytes >> (64 - kBytesShift)) return 0;
  return (bytes << kBytesShift) | (static_cast<uint64_t>(coll) << kCollShift) |
         (static_cast<uint64_t>(dtype) << kDtypeShift) | 1;
}

std::atomic<uint64_t>& AlgoChoice::memo_slot(Collective coll, uint64_t bytes, DataType dtype) const {
  return memo_[(bytes * 31 + static_cast<uint64_t>(coll) * 7 + static_cast<uint64_t>(dtype)) % kMemoEntries];
}

Algo AlgoChoice::cheapest(Collective coll, uint64_t bytes, DataType dtype, bool oneshot) const {
  const std::vector<Algo>& scheduled = weighed_[static_cast<int>(coll)];
  Algo best = scheduled.front();
  double best_s = predict(costs_, prices_, coll, best, bytes, dtype, nullptr);
  auto consider = [&](Algo a) {
    const double t = predict(costs_, prices_, coll, a, bytes, dtype, nullptr);
    if (t < best_s * 0.99) best = a, best_s = t;
  };
  for (size_t i = 1; i < scheduled.size(); ++i) consider(scheduled[i]);
  if (oneshot) consider(Algo::OneShot);
  if (multi_host_)
    for (Algo a : hier_[static_cast<int>(coll)]) consider(a);
  return best;
}

Algo AlgoChoice::choose(Collective coll, Algo requested, uint64_t bytes, DataType dtype, ReduceOp op,
                        bool deterministic) const {
  RT_CHECK(coll < Collective::Count, InvalidArgument, "unknown collective code ", static_cast<int>(coll));
  RT_CHECK(requested < Algo::Count, InvalidArgument, "unknown algo code ", static_cast<int>(requested));
  const bool rank_order = deterministic && is_reduction(coll) && dtype_is_floating(dtype);
  // Runs on every call: no allocation unless the request is refused or a hook decides.
  const std::vector<Algo>& scheduled = scheduled_[static_cast<int>(coll)];
  const std::vector<Algo>& hier = hier_[static_cast<int>(coll)];
  const bool oneshot = oneshot_fits(coll, bytes);
  // The hierarchical algorithms run on one host too (their intra-host phases alone), so a
  // script that names one runs anywhere; auto weighs them only across hosts.
  auto is_supported = [&](Algo a) {
    return (a == Algo::OneShot && oneshot) || std::find(scheduled.begin(), scheduled.end(), a) != scheduled.end() ||
           std::find(hier.begin(), hier.end(), a) != hier.end() || (a == Algo::RankOrder && is_reduction(coll));
  };
  if (requested != Algo::Auto) {  // rule 1
    if (!is_supported(requested)) refuse(coll, requested, bytes);
    return rank_order ? choose_rank_order(coll, requested, bytes, dtype, op) : requested;
  }
  if (rank_order) return choose_rank_order(coll, is_supported(forced_) ? forced_ : Algo::Auto, bytes, dtype, op);
  if (forced_ != Algo::Auto && is_supported(forced_)) return forced_;  // rule 3
  // Rule 4: a count-0 call moves nothing; in a one-shot call it also waits for nobody (its
  // fingerprint checks are deferred, oneshot.cc), where any other schedule's rank waits for its
  // peers. (The communicator runs no traffic for a count-0 collective; this is its price.)
  if (bytes == 0 && oneshot && coll != Collective::Barrier) return Algo::OneShot;
  // Rule 5: one candidate (sendrecv, gather, ... have no hierarchical form): nothing to price.
  const std::vector<Algo>& weighed = weighed_[static_cast<int>(coll)];
  if (weighed.size() == 1 && !oneshot && (!multi_host_ || hier.empty())) return weighed.front();
  // Rule 6, remembered: one word per entry, lock-free, read and written whole.
  std::atomic<uint64_t>& memo = memo_slot(coll, bytes, dtype);
  const uint64_t key = memo_key(coll, bytes, dtype);
  const uint64_t seen = memo.load(std::memory_order_relaxed);
  if (key && (seen & ~kAlgoMask) == key) return static_cast<Algo>((seen & kAlgoMask) >> kAlgoShift);
  Algo best = cheapest(coll, bytes, dtype, oneshot);
  if (const std::shared_ptr<ChoiceHook> hook = std::atomic_load(&hook_)) {
    ChoiceRequest request{coll, bytes, dtype, nranks_, topology_.num_hosts(), estimate(coll, bytes, dtype), best};
    const Algo picked = hook->choose(request);
    const bool offered = std::any_of(request.candidates.begin(), request.candidates.end(),
                                     [&](const AlgoEstimate& e) { return e.algo == picked; });
    if (!offered) {
      std::string names;
      for (const AlgoEstimate& e : request.candidates) names += str_cat(names.empty() ? "" : ", ", algo_name(e.algo));
      RT_THROW(InvalidArgument, "the algorithm hook chose '", picked < Algo::Count ? algo_name(picked) : "?", "' for ",
               collective_name(coll), " of ", bytes,
               " bytes, which is not a candidate; it must return "
               "one of ",
               names);
    }
    best = picked;
  }
  if (key) memo.store(key | (static_cast<uint64_t>(best) << kAlgoShift), std::memory_order_relaxed);
  return best;
}

std::vector<AlgoEstimate> AlgoChoice::estimate(Collective coll, uint64_t bytes, DataType dtype,
                                               bool deterministic) const {
  RT_CHECK(coll < Collective::Count, InvalidArgument, "unknown collective code ", static_cast<int>(coll));
  RT_CHECK(dtype < DataType::Count, InvalidArgument, "unknown dtype code ", static_cast<int>(dtype));
  std::vector<Algo> algos;
  if (deterministic && is_reduction(coll) && dtype_is_floating(dtype)) {
    // What choose_rank_order() weighs for a sum (min and max keep to the chain).
    algos = rank_order_algos(coll);
    if (oneshot_fits(coll, bytes)) algos.push_back(Algo::OneShot);
  } else {
    algos = available(coll, bytes);
  }
  std::vector<AlgoEstimate> out;
  for (const Candidate& c : price(costs_, prices_, coll, algos, bytes, dtype))
    out.push_back({c.algo, c.seconds, c.terms});
  return out;
}

}  // namespace ringtree
