// The algorithm choice behind algo="auto", as a unit of its own: given a stated machine (the
// cost model's figures), the ranks and their hosts, and the one-shot capacity, it says which
// algorithms a call may use, what each is predicted to cost (algorithms/pricing.h) and which
// one runs. The communicator builds one at set-up from rank 0's figures, so every rank
// chooses alike; a test builds one from figures and a topology of its own, without ranks.
//
// The rules, in the order they apply:
//   1. an algorithm the call names runs if the collective has it here, else InvalidArgument;
//   2. deterministic mode (a floating-point reduction): rank_order, or oneshot (the
//      same bits) where the call fits them and they are predicted faster (not for min and max);
//   3. RINGTREE_ALGO, where the collective has it;
//   4. a count-0 call that fits the one-shot slots gets oneshot, which waits for no peer (the
//      communicator runs no traffic at all for a count-0 collective);
//   5. one candidate: it runs;
//   6. otherwise the cheapest prediction, near-ties (within 1%) going to the earlier candidate;
//      a ChoiceHook, where one is set, makes this last decision instead.
// Rule 6's answers are remembered per (collective, bytes, dtype) in a small lock-free memo: a
// training loop calls the same sizes again and again, and the figures never change. The hook
// (ChoiceHook, ringtree/communicator.h) sees ChoiceRequest: the candidates and their costs.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "algorithms/pricing.h"
#include "ringtree/communicator.h"

namespace ringtree {

// What a choice is made from.
struct ChoiceSetup {
  int nranks = 1;
  Topology topology;           // which ranks share a host (empty: every rank on one host)
  MachineCosts costs;          // the cost model's figures
  uint64_t oneshot_bytes = 0;  // bytes a rank may publish in a one-shot call; 0: no one-shot
  Algo forced = Algo::Auto;    // RINGTREE_ALGO
};

// Bits that hold the values 0 .. n-1.
constexpr int bits_for(int n) { return n <= 1 ? 0 : 1 + bits_for((n + 1) / 2); }
static_assert(bits_for(8) == 3 && bits_for(9) == 4 && bits_for(13) == 4, "bits_for");

class AlgoChoice {
 public:
  AlgoChoice() = default;
  AlgoChoice(const AlgoChoice&) = delete;  // the price table points into topology_
  AlgoChoice& operator=(const AlgoChoice&) = delete;

  // Counts the schedules for the setup (once; about a millisecond at P = 8).
  void configure(const ChoiceSetup& setup);
  // The algorithm a call of `bytes` per rank runs (rules above); throws InvalidArgument when a
  // named algorithm is not available, saying which are.
  Algo choose(Collective coll, Algo requested, uint64_t bytes, DataType dtype, ReduceOp op = ReduceOp::Sum,
              bool deterministic = false) const;
  // Every algorithm rule 6 weighs for such a call, with its prediction and formula, in the order
  // weighed; deterministic: those rule 2 weighs (floating-point reductions only).
  std::vector<AlgoEstimate> estimate(Collective coll, uint64_t bytes, DataType dtype, bool deterministic = false) const;
  // Whether a call of `bytes` per rank fits the one-shot slots here.
  bool oneshot_fits(Collective coll, uint64_t bytes) const;
  // Replaces rule 6 (null: the cost model's pick); forgets the remembered choices.
  void set_hook(std::shared_ptr<ChoiceHook> hook);
  bool has_hook() const { return hook_ != nullptr; }
  // Whether rule 6 (the cost model, no hook) made the choice for a call that named no algorithm.
  bool cost_model_chooses(Algo requested) const {
    return requested == Algo::Auto && forced_ == Algo::Auto && hook_ == nullptr;
  }

  const MachineCosts& costs() const { return costs_; }
  const Topology& topology() const { return topology_; }
  bool multi_host() const { return multi_host_; }

 private:
  std::vector<Algo> available(Collective coll, uint64_t bytes) const;
  Algo choose_rank_order(Collective coll, Algo wanted, uint64_t bytes, DataType dtype, ReduceOp op) const;
  Algo cheapest(Collective coll, uint64_t bytes, DataType dtype, bool oneshot) const;
  [[noreturn]] void refuse(Collective coll, Algo requested, uint64_t bytes) const;

  // The memo: one word per entry, valid | algo | dtype | coll | bytes, each field as wide as its
  // enum needs, so a new algorithm, dtype or collective widens its field (and narrows bytes)
  // instead of spilling into the next one. Calls too large for the bytes field are not kept.
  static constexpr int kAlgoBits = bits_for(static_cast<int>(Algo::Count));
  static constexpr int kDtypeBits = bits_for(static_cast<int>(DataType::Count));
  static constexpr int kCollBits = bits_for(static_cast<int>(Collective::Count));
  static constexpr int kAlgoShift = 1, kDtypeShift = kAlgoShift + kAlgoBits, kCollShift = kDtypeShift + kDtypeBits;
  static constexpr int kBytesShift = kCollShift + kCollBits;
  static_assert(64 - kBytesShift >= 40, "the memo keeps calls up to 2^40 bytes and more");
  static constexpr uint64_t kAlgoMask = ((uint64_t{1} << kAlgoBits) - 1) << kAlgoShift;
  static constexpr size_t kMemoEntries = 64;
  static uint64_t memo_key(Collective coll, uint64_t bytes, DataType dtype);  // 0: not kept
  std::atomic<uint64_t>& memo_slot(Collective coll, uint64_t bytes, DataType dtype) const;

  int nranks_ = 1;
  Topology topology_;
  bool multi_host_ = false;
  MachineCosts costs_;
  PriceTable prices_;  // the schedules' counts at this P, built by configure()
  uint64_t oneshot_bytes_ = 0;
  Algo forced_ = Algo::Auto;
  std::array<std::vector<Algo>, static_cast<size_t>(Collective::Count)> scheduled_, hier_;
  // scheduled_ less what a call may only name (auto_weighs): rule 6's flat candidates.
  std::array<std::vector<Algo>, static_cast<size_t>(Collective::Count)> weighed_;
  std::shared_ptr<ChoiceHook> hook_;
  mutable std::array<std::atomic<uint64_t>, kMemoEntries> memo_{};
};

}  // namespace ringtree
