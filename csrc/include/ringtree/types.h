// Public value types shared by every layer: data types, reduce ops, collectives, algorithms.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringtree {

// The first eight are the first release's codes; later ones are appended so codes stay stable.
// Float8E4M3 is torch's float8_e4m3fn (no infinities); Float8E5M2 is IEEE-like. Both reduce in float32
// like the half types; Complex64/Complex128 are (real, imaginary) pairs of float/double.
enum class DataType : uint8_t {
  Int8,
  Uint8,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Int16,
  Uint16,
  Uint32,
  Uint64,
  Float8E4M3,
  Float8E5M2,
  Complex64,
  Complex128,
  Count
};
// BitAnd, BitOr, BitXor: integer dtypes only (torch's BAND/BOR/BXOR; bool travels as uint8).
enum class ReduceOp : uint8_t { Sum, Prod, Min, Max, Avg, PremulSum, BitAnd, BitOr, BitXor, Count };
enum class Collective : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  AllToAll,
  Broadcast,
  Reduce,
  Gather,
  Scatter,
  Barrier,
  Send,
  Recv,
  AllToAllV,
  SendRecv,
  Count
};
// Auto is resolved to a concrete algorithm before any traffic, identically on every rank.
// OneShot: every rank publishes its whole input in its shared-memory one-shot slot and every rank reads
// all of them (one message latency; single-host communicators, small messages).
// Hier, HierTree: topology-aware (algorithms/hier.cc): an intra-host phase, an inter-host phase
// between counterpart ranks of every host (ring or chain for Hier, binary tree for HierTree),
// and an intra-host phase back.
// RankOrder: deterministic mode's reductions (algorithms/rank_order.cc): every element reduced
// along the chain 0 -> 1 -> ... -> P-1, so its bits depend on nothing but the rank order.
enum class Algo : uint8_t { Auto, Ring, Tree, Direct, OneShot, Hier, HierTree, RankOrder, Count };

size_t dtype_size(DataType t);
const char* dtype_name(DataType t);
const char* op_name(ReduceOp op);
const char* collective_name(Collective c);
const char* algo_name(Algo a);
// Every dtype that is not an integer: floating types, float8 and complex (what bitwise ops refuse and
// deterministic mode orders).
bool dtype_is_floating(DataType t);
bool dtype_is_complex(DataType t);
bool is_bitwise(ReduceOp op);
// all_reduce, reduce_scatter, reduce.
bool is_reduction(Collective c);
// broadcast, reduce, gather, scatter.
bool is_rooted(Collective c);

}  // namespace ringtree
