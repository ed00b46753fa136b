// Element types the host kernels (kernels/host/reduce.cc) and the device kernels
// (kernels/cuda/reduce_device.cuh) share, written once so both produce the same bits:
//
//   float8     conversions between the two 8-bit float formats and float32, as plain bit
//              arithmetic (no hardware conversion, so every executor rounds alike):
//              e4m3fn  1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, one NaN
//                      pattern per sign (S.1111.111); largest finite 448.
//              e5m2    1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like (inf, NaN).
//              float -> float8 rounds to nearest even. Out of range, e4m3fn saturates to +-448
//              (infinities too) and e5m2 goes to +-inf: torch's conversions, which NCCL's
//              e4m3 also follows. NaN stays NaN (sign | 0x7f for e4m3fn, sign | 0x7e for e5m2).
//   Complex    a (re, im) pair of float or double. Products are written out as
//              (ac - bd, ad + bc), each product and sum rounded on its own (no fused
//              multiply-add on the device), never the C library's Annex G special cases.
#pragma once
#include <cstdint>
#include <cstring>
#include "common/host_device.h"

namespace ringtree {
namespace elements {

RT_HOST_DEVICE inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
RT_HOST_DEVICE inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// One float8 format: E exponent bits with bias B, M mantissa bits; Ieee: whether the all-ones
// exponent means inf/NaN (e5m2) or only S.1111.111 is NaN (e4m3fn).
template <int E, int M, int B, bool Ieee>
struct Float8Format {
  static constexpr uint32_t kMaxExp = (1u << E) - 1;
  // The largest finite magnitude's code: e5m2 0x7b (57344), e4m3fn 0x7e (448).
  static constexpr uint32_t kMaxFinite =
      Ieee ? ((kMaxExp - 1) << M) | ((1u << M) - 1) : (kMaxExp << M) | ((1u << M) - 2);
  static constexpr uint32_t kInf = kMaxExp << M;  // e5m2 only
  static constexpr uint32_t kNan = Ieee ? (kMaxExp << M) | (1u << (M - 1)) : 0x7fu;

  RT_HOST_DEVICE static float to_float(uint8_t v) {
    const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
    const uint32_t exp = (v >> M) & kMaxExp;
    const uint32_t man = v & ((1u << M) - 1);
    uint32_t out;
    if (exp == 0) {  // zero or subnormal: man units of 2^(1 - B - M), exact in float
      out = bits_of(static_cast<float>(man) * float_of(static_cast<uint32_t>(127 + 1 - B - M) << 23));
    } else if (Ieee && exp == kMaxExp) {
      out = man == 0 ? 0x7f800000u : 0x7fc00000u;
    } else if (!Ieee && exp == kMaxExp && man == (1u << M) - 1) {
      out = 0x7fc00000u;
    } else {
      out = ((exp + 127 - B) << 23) | (man << (23 - M));
    }
    return float_of(out | sign);
  }

  RT_HOST_DEVICE static uint8_t from_float(float f) {
    uint32_t x = bits_of(f);
    const uint32_t sign = (x >> 24) & 0x80u;
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return static_cast<uint8_t>(sign | kNan);
    uint32_t out;
    if (x < (static_cast<uint32_t>(127 + 1 - B) << 23)) {
      // Subnormal (or zero): adding 2^(23 + 1 - B - M) makes the float's unit in the last place
      // the format's subnormal unit, so the FPU rounds to nearest even; a carry lands on the
      // smallest normal's code, which is right.
      const float magic = float_of(static_cast<uint32_t>(127 + 23 + 1 - B - M) << 23);
      out = bits_of(float_of(x) + magic) - bits_of(magic);
    } else {
      // Normal: round the mantissa to M bits (to nearest even), then rebias the exponent.
      const uint32_t shift = 23 - M;
      const uint32_t odd = (x >> shift) & 1u;
      const uint64_t rounded = (static_cast<uint64_t>(x) + ((1u << (shift - 1)) - 1) + odd) >> shift;
      const uint64_t rebias = static_cast<uint64_t>(127 - B) << M;
      out = rounded - rebias > kMaxFinite ? (Ieee ? kInf : kMaxFinite) : static_cast<uint32_t>(rounded - rebias);
    }
    return static_cast<uint8_t>(sign | out);
  }
};

using E4M3 = Float8Format<4, 3, 7, false>;
using E5M2 = Float8Format<5, 2, 15, true>;

// Arithmetic that is not contracted into fused multiply-adds by the device compiler (the host
// compilers this project builds with do not contract on x86-64 without -mfma).
RT_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__) && defined(__CUDACC__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
RT_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__) && defined(__CUDACC__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

template <typename R>
struct Complex {
  R re, im;
};

template <typename R>
RT_HOST_DEVICE inline Complex<R> operator+(Complex<R> a, Complex<R> b) {
  return {a.re + b.re, a.im + b.im};
}
template <typename R>
RT_HOST_DEVICE inline Complex<R> operator*(Complex<R> a, Complex<R> b) {
  return {mul_rn(a.re, b.re) - mul_rn(a.im, b.im), mul_rn(a.re, b.im) + mul_rn(a.im, b.re)};
}
// Scaling by a real factor (premul_sum, avg): each part on its own.
template <typename R>
RT_HOST_DEVICE inline Complex<R> scaled(Complex<R> a, R factor) {
  return {mul_rn(a.re, factor), mul_rn(a.im, factor)};
}

// The unsigned type an integer sum or product is computed in, so that it wraps (two's
// complement, as NCCL's does) without undefined behaviour. 16-bit types take 32 bits: their
// product would otherwise be promoted to (signed) int and could overflow.
template <typename T>
struct Wrapping {
  using type = T;
};
template <>
struct Wrapping<int8_t> {
  using type = uint8_t;
};
template <>
struct Wrapping<int16_t> {
  using type = uint32_t;
};
template <>
struct Wrapping<uint16_t> {
  using type = uint32_t;
};
template <>
struct Wrapping<int32_t> {
  using type = uint32_t;
};
template <>
struct Wrapping<int64_t> {
  using type = uint64_t;
};

}  // namespace elements
}  // namespace ringtree
