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
    case DataType::Float8E4M3:
    case DataType::Float8E5M2:
      return 1;
    case DataType::Float16:
    case DataType::BFloat16:
    case DataType::Int16:
    case DataType::Uint16:
      return 2;
    case DataType::Int32:
    case DataType::Float32:
    case DataType::Uint32:
      return 4;
    case DataType::Int64:
    case DataType::Float64:
    case DataType::Uint64:
    case DataType::Complex64:
      return 8;
    case DataType::Complex128:
      return 16;
    default:
      return 0;
  }
}

const char* dtype_name(DataType t) {
  // numpy's names (ml_dtypes' for the float8 types), which are also torch's.
  static const char* names[] = {"int8",          "uint8",       "int32",     "int64",     "float16", "bfloat16",
                                "float32",       "float64",     "int16",     "uint16",    "uint32",  "uint64",
                                "float8_e4m3fn", "float8_e5m2", "complex64", "complex128"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<size_t>(DataType::Count), "one name per dtype");
  return t < DataType::Count ? names[static_cast<int>(t)] : "invalid-dtype";
}

bool dtype_is_floating(DataType t) {
  switch (t) {
    case DataType::Float16:
    case DataType::BFloat16:
    case DataType::Float32:
    case DataType::Float64:
    case DataType::Float8E4M3:
    case DataType::Float8E5M2:
    case DataType::Complex64:
    case DataType::Complex128:
      return true;
    default:
      return false;
  }
}

bool dtype_is_complex(DataType t) { return t == DataType::Complex64 || t == DataType::Complex128; }

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
