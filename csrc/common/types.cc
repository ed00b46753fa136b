#include <cerrno>
#include <cstring>
#include "common/check.h"
#include "common/collective.h"
#include "ringtree/types.h"

namespace ringtree {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::Int8:
    case DataType::Uint8:
      return 1;
    case DataType::Float16:
    case DataType::BFloat16:
      return 2;
    case DataType::Int32:
    case DataType::Float32:
      return 4;
    case DataType::Int64:
    case DataType::Float64:
      return 8;
    default:
      return 0;
  }
}

const char* dtype_name(DataType t) {
  static const char* names[] = {"int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
  return t < DataType::Count ? names[static_cast<int>(t)] : "invalid-dtype";
}

bool dtype_is_floating(DataType t) {
  return t == DataType::Float16 || t == DataType::BFloat16 || t == DataType::Float32 || t == DataType::Float64;
}

bool is_bitwise(ReduceOp op) { return op == ReduceOp::BitAnd || op == ReduceOp::BitOr || op == ReduceOp::BitXor; }

bool is_reduction(Collective c) { return c < Collective::Count && collective_traits(c).reduction; }

bool is_rooted(Collective c) { return c < Collective::Count && collective_traits(c).rooted; }

const char* op_name(ReduceOp op) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg", "premul_sum", "band", "bor", "bxor"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(ReduceOp::Count), "one name per op");
  return op < ReduceOp::Count ? names[static_cast<int>(op)] : "invalid-op";
}

const char* collective_name(Collective c) {
  static const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                                "reduce",     "gather",         "scatter",    "barrier",    "send",
                                "recv",       "all_to_all_v",   "sendrecv"};
  return c < Collective::Count ? names[static_cast<int>(c)] : "invalid-collective";
}

const char* algo_name(Algo a) {
  static const char* names[] = {"auto", "ring", "tree", "direct", "oneshot", "hier", "hier_tree", "rank_order"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(Algo::Count), "one name per algorithm");
  return a < Algo::Count ? names[static_cast<int>(a)] : "invalid-algo";
}

const char* error_kind_name(ErrorKind k) {
  static const char* names[] = {"error",   "invalid_argument", "timeout", "peer_failure", "collective_mismatch",
                                "aborted", "bootstrap"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(ErrorKind::Count), "one name per kind");
  return k < ErrorKind::Count ? names[static_cast<int>(k)] : "error";
}

std::exception_ptr make_error(ErrorKind kind, const std::string& what) {
  switch (kind) {
    case ErrorKind::InvalidArgument:
      return std::make_exception_ptr(InvalidArgument(what));
    case ErrorKind::Timeout:
      return std::make_exception_ptr(Timeout(what));
    case ErrorKind::PeerFailure:
      return std::make_exception_ptr(PeerFailure(what));
    case ErrorKind::CollectiveMismatch:
      return std::make_exception_ptr(CollectiveMismatch(what));
    case ErrorKind::Aborted:
      return std::make_exception_ptr(Aborted(what));
    case ErrorKind::Bootstrap:
      return std::make_exception_ptr(BootstrapError(what));
    default:
      return std::make_exception_ptr(Error(what));
  }
}

void throw_error(ErrorKind kind, const std::string& what) { std::rethrow_exception(make_error(kind, what)); }

void throw_system_error(const std::string& what, int err) { throw Error(what + ": " + std::strerror(err)); }

}  // namespace ringtree
