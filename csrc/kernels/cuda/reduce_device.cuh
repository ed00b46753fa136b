// Device-side building blocks of the CUDA reduce/copy kernels (device header: include only
// from .cu files). The host launchers are declared in reduce.h.
//
// Terms:
//   storage type  how an element sits in memory (int8_t ... double; f16_t / bf16_t / f8e4m3_t /
//                 f8e5m2_t for the narrow floats, kept as raw bit patterns so they are trivially
//                 copyable and packable like every other type; elements::Complex<float / double>
//                 for the complex types).
//   compute type  what the arithmetic runs in: the storage type itself, except that the narrow
//                 floats widen to float and integer sum/prod run in an unsigned type at least as
//                 wide (so overflow wraps without undefined behaviour, as in kernels/reduce.cc).
//   pack          16 bytes of consecutive elements, moved with one 128-bit load or store.
//
// Every rule here mirrors csrc/kernels/host/reduce.cc element for element, so a schedule run on the
// GPU produces the same bits as on the host (NaN payloads of half types aside: the hardware
// conversion picks its own canonical NaN).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include "common/check.h"
#include "kernels/elements.h"
#include "ringtree/types.h"

namespace ringtree {
namespace cuda {

struct f16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
struct f8e4m3_t {
  uint8_t bits;
};
struct f8e5m2_t {
  uint8_t bits;
};
using c64_t = elements::Complex<float>;
using c128_t = elements::Complex<double>;

// ---- widening and narrowing between storage and compute type ------------------------------

template <typename T>
struct Arith {
  using C = T;
  __device__ static C up(T x) { return x; }
  __device__ static T down(C c) { return c; }
};
template <>
struct Arith<f16_t> {
  using C = float;
  __device__ static C up(f16_t x) { return __half2float(__ushort_as_half(x.bits)); }
  __device__ static f16_t down(C c) { return f16_t{__half_as_ushort(__float2half_rn(c))}; }  // RNE, as the host
};
template <>
struct Arith<bf16_t> {
  using C = float;
  __device__ static C up(bf16_t x) { return __uint_as_float(static_cast<uint32_t>(x.bits) << 16); }
  __device__ static bf16_t down(C c) { return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(c))}; }
};
// float8: the shared bit conversions (kernels/elements.h), not the hardware's saturating ones.
template <>
struct Arith<f8e4m3_t> {
  using C = float;
  __device__ static C up(f8e4m3_t x) { return elements::E4M3::to_float(x.bits); }
  __device__ static f8e4m3_t down(C c) { return f8e4m3_t{elements::E4M3::from_float(c)}; }
};
template <>
struct Arith<f8e5m2_t> {
  using C = float;
  __device__ static C up(f8e5m2_t x) { return elements::E5M2::to_float(x.bits); }
  __device__ static f8e5m2_t down(C c) { return f8e5m2_t{elements::E5M2::from_float(c)}; }
};

// ---- reduce ops -----------------------------------------------------------------------------
// Same formulas as the host (b < a ? b : a, not fminf), so NaN handling matches too.

struct OpSum {
  static constexpr bool kWraps = true;
  static constexpr bool kBitwise = false;
  static constexpr bool kOrdered = false;
  template <typename C>
  __device__ static C apply(C a, C b) {
    return a + b;
  }
};
struct OpProd {
  static constexpr bool kWraps = true;
  static constexpr bool kBitwise = false;
  static constexpr bool kOrdered = false;
  template <typename C>
  __device__ static C apply(C a, C b) {
    return a * b;
  }
};
struct OpMin {
  static constexpr bool kWraps = false;
  static constexpr bool kBitwise = false;
  static constexpr bool kOrdered = true;
  template <typename C>
  __device__ static C apply(C a, C b) {
    return b < a ? b : a;
  }
};
struct OpMax {
  static constexpr bool kWraps = false;
  static constexpr bool kBitwise = false;
  static constexpr bool kOrdered = true;
  template <typename C>
  __device__ static C apply(C a, C b) {
    return a < b ? b : a;
  }
};
// Integer storage types only (for_op_types never instantiates them for the others).
struct OpBitAnd {
  static constexpr bool kWraps = false;
  static constexpr bool kBitwise = true;
  static constexpr bool kOrdered = false;
  template <typename C>
  __device__ static C apply(C a, C b) {
    return a & b;
  }
};
struct OpBitOr {
  static constexpr bool kWraps = false;
  static constexpr bool kBitwise = true;
  static constexpr bool kOrdered = false;
  template <typename C>
  __device__ static C apply(C a, C b) {
    return a | b;
  }
};
struct OpBitXor {
  static constexpr bool kWraps = false;
  static constexpr bool kBitwise = true;
  static constexpr bool kOrdered = false;
  template <typename C>
  __device__ static C apply(C a, C b) {
    return a ^ b;
  }
};

// dst = a (op) b for one element.
template <typename T, typename Op>
struct Combine {
  __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T> && Op::kWraps) {
      using U = typename elements::Wrapping<T>::type;
      return static_cast<T>(Op::apply(static_cast<U>(a), static_cast<U>(b)));
    } else {
      return Arith<T>::down(Op::apply(Arith<T>::up(a), Arith<T>::up(b)));
    }
  }
};

// ---- the premul_sum and avg passes (unary: the second operand is ignored) --------------------
// Host rules: floating types multiply/divide in double and round to float (then to the narrow
// type); complex types treat each part as their real type; integers multiply by the factor
// converted to int64 (wrapping) and divide truncating (unsigned types as unsigned).

template <typename T>
struct Scale {
  double factor;        // floating types
  uint64_t int_factor;  // integer types: (uint64_t)(int64_t)factor, computed on the host
  __device__ T operator()(T a, T) const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(static_cast<int64_t>(a)) * int_factor));
    } else if constexpr (std::is_same_v<T, double>) {
      return a * factor;
    } else if constexpr (std::is_same_v<T, c64_t>) {
      return c64_t{static_cast<float>(static_cast<double>(a.re) * factor),
                   static_cast<float>(static_cast<double>(a.im) * factor)};
    } else if constexpr (std::is_same_v<T, c128_t>) {
      return c128_t{a.re * factor, a.im * factor};
    } else {
      return Arith<T>::down(static_cast<float>(static_cast<double>(Arith<T>::up(a)) * factor));
    }
  }
};

template <typename T>
struct Divide {
  int64_t divisor;
  __device__ T operator()(T a, T) const {
    if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
      return static_cast<T>(static_cast<uint64_t>(a) / static_cast<uint64_t>(divisor));
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<int64_t>(a) / divisor);
    } else if constexpr (std::is_same_v<T, double>) {
      return a / static_cast<double>(divisor);
    } else if constexpr (std::is_same_v<T, c64_t>) {
      const double d = static_cast<double>(divisor);
      return c64_t{static_cast<float>(static_cast<double>(a.re) / d),
                   static_cast<float>(static_cast<double>(a.im) / d)};
    } else if constexpr (std::is_same_v<T, c128_t>) {
      return c128_t{a.re / static_cast<double>(divisor), a.im / static_cast<double>(divisor)};
    } else {
      return Arith<T>::down(static_cast<float>(static_cast<double>(Arith<T>::up(a)) / static_cast<double>(divisor)));
    }
  }
};

// ---- packs ------------------------------------------------------------------------------------

constexpr size_t kPackBytes = 16;
template <typename T>
struct alignas(kPackBytes) Pack {
  static constexpr int kElems = static_cast<int>(kPackBytes / sizeof(T));
  T v[kElems];
};

// How one elementwise call splits its range: `head` scalar elements up to the first 16-byte
// boundary, `packs` whole packs, then `tail` scalar elements. When the three pointers are not
// equally misaligned no pack can be formed and everything is scalar (head = count).
struct Split {
  size_t head, packs, tail;
};

// The split of [0, count) for three arrays of T: packs where all three sit at the same offset
// within 16 bytes (and at whole elements), else everything scalar.
template <typename T>
__host__ __device__ inline Split split_by_phase(const void* dst, const void* a, const void* b, size_t count) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) % kPackBytes;
  const bool same_phase = reinterpret_cast<uintptr_t>(a) % kPackBytes == mis &&
                          reinterpret_cast<uintptr_t>(b) % kPackBytes == mis && mis % sizeof(T) == 0;
  if (!same_phase) return Split{count, 0, 0};
  const size_t E = Pack<T>::kElems;
  size_t head = ((kPackBytes - mis) % kPackBytes) / sizeof(T);
  if (head > count) head = count;
  const size_t packs = (count - head) / E;
  return Split{head, packs, count - head - packs * E};
}

// How elementwise reads its operands. DirectLoads: plain loads (the reduce kernels, whose inputs
// their stream has ordered). L2Loads: through L2 with __ldcg, never a stale L1 line (the walk
// kernel, whose operands another block or another rank may have just written); __ldcg takes
// built-in types only, hence the raw words (as wide as the type's alignment: a complex element is
// two of them).
template <size_t N>
struct RawOf;
template <>
struct RawOf<1> {
  using type = unsigned char;
};
template <>
struct RawOf<2> {
  using type = unsigned short;
};
template <>
struct RawOf<4> {
  using type = unsigned int;
};
template <>
struct RawOf<8> {
  using type = unsigned long long;
};
struct DirectLoads {
  template <typename T>
  __device__ static Pack<T> pack(const Pack<T>* p) {
    return *p;
  }
  template <typename T>
  __device__ static T scalar(const T* p) {
    return *p;
  }
};
struct L2Loads {
  template <typename T>
  __device__ static Pack<T> pack(const Pack<T>* p) {
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(p));
    Pack<T> v;
    memcpy(&v, &raw, sizeof(v));
    return v;
  }
  template <typename T>
  __device__ static T scalar(const T* p) {
    using Raw = typename RawOf<alignof(T)>::type;
    constexpr int kWords = sizeof(T) / alignof(T);
    Raw raw[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[w] = __ldcg(reinterpret_cast<const Raw*>(p) + w);
    T v;
    memcpy(&v, raw, sizeof(T));
    return v;
  }
};

// dst[i] = f(a[i], b[i]) for i in [0, count), this thread taking elements first, first + stride,
// ... of each part. dst may alias a or b exactly (each element is read before it is written by the
// same thread), never partially.
template <typename Loads, typename T, typename F>
__device__ void elementwise_strided(T* dst, const T* a, const T* b, Split s, F f, size_t first, size_t stride) {
  constexpr int E = Pack<T>::kElems;
  // Body: consecutive threads take consecutive packs, so every warp moves 512 contiguous bytes.
  const Pack<T>* pa = reinterpret_cast<const Pack<T>*>(a + s.head);
  const Pack<T>* pb = reinterpret_cast<const Pack<T>*>(b + s.head);
  Pack<T>* pd = reinterpret_cast<Pack<T>*>(dst + s.head);
  for (size_t p = first; p < s.packs; p += stride) {
    const Pack<T> x = Loads::pack(pa + p);
    const Pack<T> y = Loads::pack(pb + p);
    Pack<T> z;
#pragma unroll
    for (int e = 0; e < E; ++e) z.v[e] = f(x.v[e], y.v[e]);
    pd[p] = z;
  }
  // Head and tail: fewer than 2 packs' worth of elements unless the call is all-scalar.
  const size_t scalars = s.head + s.tail;
  const size_t tail_start = s.head + s.packs * E;
  for (size_t i = first; i < scalars; i += stride) {
    const size_t idx = i < s.head ? i : tail_start + (i - s.head);
    dst[idx] = f(Loads::scalar(a + idx), Loads::scalar(b + idx));
  }
}

// The same over the whole grid, with plain loads (one reduce kernel).
template <typename T, typename F>
__device__ void elementwise(T* dst, const T* a, const T* b, Split s, F f) {
  elementwise_strided<DirectLoads>(dst, a, b, s, f, blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x,
                                   static_cast<size_t>(gridDim.x) * blockDim.x);
}

// Calls fn(T{}) with the storage type of `dtype` (host side: picks the kernel instance).
template <typename Fn>
void with_storage_type(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::Int8:
      return fn(int8_t{});
    case DataType::Uint8:
      return fn(uint8_t{});
    case DataType::Int32:
      return fn(int32_t{});
    case DataType::Int64:
      return fn(int64_t{});
    case DataType::Float16:
      return fn(f16_t{});
    case DataType::BFloat16:
      return fn(bf16_t{});
    case DataType::Float32:
      return fn(float{});
    case DataType::Float64:
      return fn(double{});
    case DataType::Int16:
      return fn(int16_t{});
    case DataType::Uint16:
      return fn(uint16_t{});
    case DataType::Uint32:
      return fn(uint32_t{});
    case DataType::Uint64:
      return fn(uint64_t{});
    case DataType::Float8E4M3:
      return fn(f8e4m3_t{});
    case DataType::Float8E5M2:
      return fn(f8e5m2_t{});
    case DataType::Complex64:
      return fn(c64_t{});
    case DataType::Complex128:
      return fn(c128_t{});
    default:
      RT_THROW(InvalidArgument, "unsupported dtype code ", static_cast<int>(dtype));
  }
}

// with_storage_type for a reduce op: the bitwise ops exist for the integer types only, min and
// max for the ordered ones (validate_call refuses the others before any kernel is chosen).
template <typename Op, typename Fn>
void for_op_types(DataType dtype, Fn&& fn) {
  if constexpr (Op::kBitwise) {
    RT_CHECK(!dtype_is_floating(dtype), InvalidArgument, "bitwise reductions need an integer dtype, got ",
             dtype_name(dtype));
    with_storage_type(dtype, [&](auto tag) {
      if constexpr (std::is_integral_v<decltype(tag)>) fn(tag);
    });
  } else if constexpr (Op::kOrdered) {
    RT_CHECK(!dtype_is_complex(dtype), InvalidArgument, "min and max need an ordered dtype, got ", dtype_name(dtype));
    with_storage_type(dtype, [&](auto tag) {
      if constexpr (!std::is_same_v<decltype(tag), c64_t> && !std::is_same_v<decltype(tag), c128_t>) fn(tag);
    });
  } else {
    with_storage_type(dtype, fn);
  }
}

// Calls fn(Op{}, T{}) for every reduce op and every storage type it exists for: every instance
// of the kernels that reduce (host side: loading them all up front).
template <typename Fn>
void for_each_op_and_type(Fn&& fn) {
  auto each_type = [&](auto op) {
    using Op = decltype(op);
    for (int d = 0; d < static_cast<int>(DataType::Count); ++d) {
      const auto dtype = static_cast<DataType>(d);
      if (Op::kBitwise && dtype_is_floating(dtype)) continue;
      if (Op::kOrdered && dtype_is_complex(dtype)) continue;
      for_op_types<Op>(dtype, [&](auto tag) { fn(op, tag); });
    }
  };
  each_type(OpSum{});
  each_type(OpProd{});
  each_type(OpMin{});
  each_type(OpMax{});
  each_type(OpBitAnd{});
  each_type(OpBitOr{});
  each_type(OpBitXor{});
}

}  // namespace cuda
}  // namespace ringtree
