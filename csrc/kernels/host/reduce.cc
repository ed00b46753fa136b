// Written as plain loops over restrict-free, branch-free element functions so the compiler
// vectorizes them; the half conversions are bit manipulations (no per-element library calls).
// These are the portable kernels. On x86-64 CPUs with AVX2 and F16C the float16/bfloat16 ones
// give way to reduce_x86.cc's, which round identically; the choice is made once per process.
#include "kernels/host/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include "common/check.h"
#include "common/settings.h"
#include "kernels/elements.h"
#include "kernels/host/reduce_x86.h"

namespace ringtree {

namespace {

inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t magnitude = h & 0x7fffu;
  // Shifting the exponent+mantissa into float position and scaling by 2^112 rebiases the
  // exponent (15 -> 127) and normalizes subnormals in one multiply.
  float scaled = u2f(magnitude << 13) * 0x1p112f;
  uint32_t bits = magnitude >= 0x7c00u ? (0x7f800000u | ((magnitude & 0x3ffu) << 13)) : f2u(scaled);
  return u2f(bits | sign);
}

uint16_t float_to_half(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t out;
  if (x >= 0x47800000u) {  // >= 65536 after rounding range, inf or nan
    out = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 0x38800000u) {  // result is subnormal or zero: let the FPU round
    out = f2u(u2f(x) + 0.5f) - 0x3f000000u;
  } else {  // normal: rebias exponent, round to nearest even
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd;  // (15-127)<<23 plus the rounding bias
    out = x >> 13;
  }
  return static_cast<uint16_t>(out | sign);
}

float bf16_to_float(uint16_t h) { return u2f(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

struct OpSum {
  template <typename T>
  static T apply(T a, T b) {
    return a + b;
  }
};
struct OpProd {
  template <typename T>
  static T apply(T a, T b) {
    return a * b;
  }
};
struct OpMin {
  template <typename T>
  static T apply(T a, T b) {
    return b < a ? b : a;
  }
};
struct OpMax {
  template <typename T>
  static T apply(T a, T b) {
    return a < b ? b : a;
  }
};
struct OpBitAnd {
  template <typename T>
  static T apply(T a, T b) {
    return a & b;
  }
};
struct OpBitOr {
  template <typename T>
  static T apply(T a, T b) {
    return a | b;
  }
};
struct OpBitXor {
  template <typename T>
  static T apply(T a, T b) {
    return a ^ b;
  }
};

template <typename T, typename Op>
void reduce_plain(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if constexpr (std::is_integral_v<T> && (std::is_same_v<Op, OpSum> || std::is_same_v<Op, OpProd>)) {
    using U = typename elements::Wrapping<T>::type;
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(Op::apply(static_cast<U>(x[i]), static_cast<U>(y[i])));
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(Op::apply(x[i], y[i]));
  }
}

// The narrow float types (float16, bfloat16, float8): widened to float, reduced, rounded back.
template <typename S, float (*ToFloat)(S), S (*FromFloat)(float), typename Op>
void reduce_narrow(void* dst, const void* a, const void* b, size_t n) {
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  // Blocked so the widened values stay in registers / L1 and both loops vectorize.
  constexpr size_t kBlock = 256;
  float fx[kBlock], fy[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) fx[i] = ToFloat(x[base + i]);
    for (size_t i = 0; i < m; ++i) fy[i] = ToFloat(y[base + i]);
    for (size_t i = 0; i < m; ++i) d[base + i] = FromFloat(Op::apply(fx[i], fy[i]));
  }
}

// The integer dtypes' kernels (every op has them), else null.
template <typename Op>
ReduceFn pick_integer(DataType t) {
  switch (t) {
    case DataType::Int8:
      return reduce_plain<int8_t, Op>;
    case DataType::Uint8:
      return reduce_plain<uint8_t, Op>;
    case DataType::Int32:
      return reduce_plain<int32_t, Op>;
    case DataType::Int64:
      return reduce_plain<int64_t, Op>;
    case DataType::Int16:
      return reduce_plain<int16_t, Op>;
    case DataType::Uint16:
      return reduce_plain<uint16_t, Op>;
    case DataType::Uint32:
      return reduce_plain<uint32_t, Op>;
    case DataType::Uint64:
      return reduce_plain<uint64_t, Op>;
    default:
      return nullptr;
  }
}

template <typename Op>
ReduceFn pick(DataType t) {
  if (ReduceFn f = pick_integer<Op>(t)) return f;
  switch (t) {
    case DataType::Float16:
      return reduce_narrow<uint16_t, half_to_float, float_to_half, Op>;
    case DataType::BFloat16:
      return reduce_narrow<uint16_t, bf16_to_float, float_to_bf16, Op>;
    case DataType::Float32:
      return reduce_plain<float, Op>;
    case DataType::Float64:
      return reduce_plain<double, Op>;
    case DataType::Float8E4M3:
      return reduce_narrow<uint8_t, elements::E4M3::to_float, elements::E4M3::from_float, Op>;
    case DataType::Float8E5M2:
      return reduce_narrow<uint8_t, elements::E5M2::to_float, elements::E5M2::from_float, Op>;
    case DataType::Complex64:
    case DataType::Complex128:
      // Complex numbers have no order: validate_call refuses min and max earlier, with the collective's name.
      if constexpr (std::is_same_v<Op, OpSum> || std::is_same_v<Op, OpProd>) {
        if (t == DataType::Complex64) return reduce_plain<elements::Complex<float>, Op>;
        return reduce_plain<elements::Complex<double>, Op>;
      } else {
        RT_THROW(InvalidArgument, "min and max need an ordered dtype, got ", dtype_name(t));
      }
    default:
      RT_THROW(InvalidArgument, "unsupported dtype code ", static_cast<int>(t));
  }
}

// Bitwise ops exist for integers only; validate_call refuses them on floating dtypes earlier,
// with the collective's name.
template <typename Op>
ReduceFn pick_bitwise(DataType t) {
  if (ReduceFn f = pick_integer<Op>(t)) return f;
  RT_THROW(InvalidArgument, "bitwise reductions need an integer dtype, got ", dtype_name(t));
}

template <typename T, typename F>
void map_plain(void* dst, const void* src, size_t n, F f) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = f(s[i]);
}

template <typename S, float (*ToFloat)(S), S (*FromFloat)(float), typename F>
void map_narrow(void* dst, const void* src, size_t n, F f) {
  S* d = static_cast<S*>(dst);
  const S* s = static_cast<const S*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = FromFloat(f(ToFloat(s[i])));
}

// Applies an arithmetic map in the dtype's compute type: int64 for the integers (uint64 itself, so
// that its division stays unsigned), float for the narrow floats. Complex dtypes map each part as
// their real type (scale_elements and divide_elements).
template <typename F>
void map_elements(void* dst, const void* src, size_t n, DataType t, F f) {
  switch (t) {
    case DataType::Int8:
      return map_plain<int8_t>(dst, src, n, [&](int8_t v) { return static_cast<int8_t>(f(static_cast<int64_t>(v))); });
    case DataType::Uint8:
      return map_plain<uint8_t>(dst, src, n,
                                [&](uint8_t v) { return static_cast<uint8_t>(f(static_cast<int64_t>(v))); });
    case DataType::Int32:
      return map_plain<int32_t>(dst, src, n,
                                [&](int32_t v) { return static_cast<int32_t>(f(static_cast<int64_t>(v))); });
    case DataType::Int64:
      return map_plain<int64_t>(dst, src, n, [&](int64_t v) { return f(v); });
    case DataType::Int16:
      return map_plain<int16_t>(dst, src, n,
                                [&](int16_t v) { return static_cast<int16_t>(f(static_cast<int64_t>(v))); });
    case DataType::Uint16:
      return map_plain<uint16_t>(dst, src, n,
                                 [&](uint16_t v) { return static_cast<uint16_t>(f(static_cast<int64_t>(v))); });
    case DataType::Uint32:
      return map_plain<uint32_t>(dst, src, n,
                                 [&](uint32_t v) { return static_cast<uint32_t>(f(static_cast<int64_t>(v))); });
    case DataType::Uint64:
      return map_plain<uint64_t>(dst, src, n, [&](uint64_t v) { return f(v); });
    case DataType::Float16:
      return map_narrow<uint16_t, half_to_float, float_to_half>(dst, src, n,
                                                                [&](float v) { return static_cast<float>(f(v)); });
    case DataType::BFloat16:
      return map_narrow<uint16_t, bf16_to_float, float_to_bf16>(dst, src, n,
                                                                [&](float v) { return static_cast<float>(f(v)); });
    case DataType::Float8E4M3:
      return map_narrow<uint8_t, elements::E4M3::to_float, elements::E4M3::from_float>(
          dst, src, n, [&](float v) { return static_cast<float>(f(v)); });
    case DataType::Float8E5M2:
      return map_narrow<uint8_t, elements::E5M2::to_float, elements::E5M2::from_float>(
          dst, src, n, [&](float v) { return static_cast<float>(f(v)); });
    case DataType::Complex64:
      return map_plain<elements::Complex<float>>(dst, src, n, [&](elements::Complex<float> v) {
        return elements::Complex<float>{static_cast<float>(f(v.re)), static_cast<float>(f(v.im))};
      });
    case DataType::Complex128:
      return map_plain<elements::Complex<double>>(
          dst, src, n, [&](elements::Complex<double> v) { return elements::Complex<double>{f(v.re), f(v.im)}; });
    case DataType::Float32:
      return map_plain<float>(dst, src, n, [&](float v) { return static_cast<float>(f(v)); });
    case DataType::Float64:
      return map_plain<double>(dst, src, n, [&](double v) { return f(v); });
    default:
      RT_THROW(InvalidArgument, "unsupported dtype code ", static_cast<int>(t));
  }
}

enum class KernelIsa { Scalar, Avx2F16c };

KernelIsa detect_kernel_isa() {
  const std::string setting = setting_str(Setting::KernelIsa);
  RT_CHECK(setting == "auto" || setting == "scalar", InvalidArgument,
           "RINGTREE_KERNEL_ISA must be auto or scalar, got '", setting, "'");
#if defined(__x86_64__)
  if (setting == "auto" && x86::cpu_has_avx2_f16c()) return KernelIsa::Avx2F16c;
#endif
  return KernelIsa::Scalar;
}

KernelIsa kernel_isa() {
  static const KernelIsa isa = detect_kernel_isa();
  return isa;
}

#if defined(__x86_64__)
// Whether dtype takes the AVX2 + F16C kernels.
bool vector_half(DataType dtype) {
  return (dtype == DataType::Float16 || dtype == DataType::BFloat16) && kernel_isa() == KernelIsa::Avx2F16c;
}
#endif

}  // namespace

const char* kernel_isa_name() { return kernel_isa() == KernelIsa::Avx2F16c ? "avx2+f16c" : "scalar"; }

ReduceFn reduce_fn(DataType dtype, ReduceOp op) {
#if defined(__x86_64__)
  if (vector_half(dtype)) {
    const ReduceOp base = (op == ReduceOp::Avg || op == ReduceOp::PremulSum) ? ReduceOp::Sum : op;
    if (ReduceFn fn = x86::half_reduce_fn(dtype, base)) return fn;  // else an invalid op: thrown below
  }
#endif
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
    case ReduceOp::PremulSum:
      return pick<OpSum>(dtype);
    case ReduceOp::Prod:
      return pick<OpProd>(dtype);
    case ReduceOp::Min:
      return pick<OpMin>(dtype);
    case ReduceOp::Max:
      return pick<OpMax>(dtype);
    case ReduceOp::BitAnd:
      return pick_bitwise<OpBitAnd>(dtype);
    case ReduceOp::BitOr:
      return pick_bitwise<OpBitOr>(dtype);
    case ReduceOp::BitXor:
      return pick_bitwise<OpBitXor>(dtype);
    default:
      RT_THROW(InvalidArgument, "unsupported reduce op code ", static_cast<int>(op));
  }
}

void scale_elements(void* dst, const void* src, size_t count, DataType dtype, double factor) {
#if defined(__x86_64__)
  if (vector_half(dtype)) return x86::half_scale(dst, src, count, dtype, factor);
#endif
  if (dtype_is_floating(dtype)) {
    map_elements(dst, src, count, dtype, [factor](auto v) { return static_cast<decltype(v)>(v * factor); });
  } else {
    // Integer premul_sum multiplies by the factor converted to the integer type (wrapping).
    const uint64_t f = static_cast<uint64_t>(static_cast<int64_t>(factor));
    map_elements(dst, src, count, dtype,
                 [f](auto v) { return static_cast<decltype(v)>(static_cast<int64_t>(static_cast<uint64_t>(v) * f)); });
  }
}

void divide_elements(void* dst, size_t count, DataType dtype, int64_t divisor) {
#if defined(__x86_64__)
  if (vector_half(dtype)) return x86::half_divide(dst, count, dtype, static_cast<double>(divisor));
#endif
  if (dtype_is_floating(dtype)) {
    const double d = static_cast<double>(divisor);
    map_elements(dst, dst, count, dtype, [d](auto v) { return static_cast<decltype(v)>(v / d); });
  } else {
    map_elements(dst, dst, count, dtype, [divisor](auto v) { return static_cast<decltype(v)>(v / divisor); });
  }
}

}  // namespace ringtree
