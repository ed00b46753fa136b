// AVX2 + F16C versions of the float16/bfloat16 kernels. Each function carries a target attribute
// instead of the file being built with -mavx2: inline functions pulled in from headers then stay
// baseline x86-64 code, so the linker can never keep an AVX2 copy that other code calls on a CPU
// without it.
//
// Bit-identical to reduce.cc's scalar path, which fixes some choices below:
//  - float16 NaN results become 0x7e00 with the NaN's sign (float_to_half drops the payload),
//    whereas _mm256_cvtps_ph keeps the payload's top bits; they are cleared after conversion.
//  - min/max keep `a` when either operand is NaN (b < a ? b : a), which is what minps/maxps do
//    with `b` as the first operand.
//  - scale/divide compute in double and round to float before rounding to half, as the scalar
//    map does; a float multiply would round once instead of twice and differ on rare inputs.
//  - Tails run the same 16-element block on zero-padded copies, so every element goes through
//    the same instructions whatever the count.
#include "kernels/host/reduce_x86.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <cstring>

#define RT_AVX2 __attribute__((target("avx2,f16c")))

namespace ringtree::x86 {

namespace {

constexpr size_t kBlock = 16;  // elements per iteration: two __m256 of widened floats

// A 16-element block widened to two float vectors. The lane order is whatever the format's load
// produces (for bfloat16: even elements in lo, odd in hi); its store undoes it, and all
// arithmetic is elementwise.
struct Wide {
  __m256 lo, hi;
};

struct Float16 {
  RT_AVX2 static Wide load(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  RT_AVX2 static void store(uint16_t* p, Wide w) {
    __m256i h = _mm256_set_m128i(_mm256_cvtps_ph(w.hi, _MM_FROUND_TO_NEAREST_INT),
                                 _mm256_cvtps_ph(w.lo, _MM_FROUND_TO_NEAREST_INT));
    // NaNs out of cvtps_ph are quiet (bit 9 set); clearing bits 0-8 leaves sign | 0x7e00.
    __m256i is_nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7c00));
    h = _mm256_andnot_si256(_mm256_and_si256(is_nan, _mm256_set1_epi16(0x01ff)), h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
};

struct BFloat16 {
  // Each 32-bit lane holds two elements; in place, the odd one is already a float once the even
  // one is masked off, and the even one becomes a float shifted left by 16. No shuffles needed.
  RT_AVX2 static Wide load(const uint16_t* p) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
  }
  // float_to_bf16 on 8 lanes, each result in the high 16 bits of its lane (the low 16 are junk).
  RT_AVX2 static __m256i narrow(__m256 f) {
    __m256i x = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
    __m256i quiet_nan = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));  // bf16's 0x40
    __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  }
  RT_AVX2 static void store(uint16_t* p, Wide w) {
    __m256i even = _mm256_srli_epi32(narrow(w.lo), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_blend_epi16(even, narrow(w.hi), 0xaa));
  }
};

// When both operands are NaN, x86 returns the first source operand's. The scalar path (as GCC
// compiles it) returns b's for sum and prod; the compiler may commute an intrinsic's operands, so
// the order is pinned with asm (AT&T order: second source, first source, destination).
struct Sum {
  RT_AVX2 static __m256 apply(__m256 a, __m256 b) {
    __m256 r;
    asm("vaddps %2, %1, %0" : "=x"(r) : "x"(b), "xm"(a));
    return r;
  }
};
struct Prod {
  RT_AVX2 static __m256 apply(__m256 a, __m256 b) {
    __m256 r;
    asm("vmulps %2, %1, %0" : "=x"(r) : "x"(b), "xm"(a));
    return r;
  }
};
// minps/maxps return their second operand when either is NaN: b < a ? b : a and b > a ? b : a.
struct Min {
  RT_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_min_ps(b, a); }
};
struct Max {
  RT_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_max_ps(b, a); }
};

template <typename Format, typename Op>
RT_AVX2 inline void reduce_block(uint16_t* d, const uint16_t* x, const uint16_t* y) {
  Wide a = Format::load(x), b = Format::load(y);
  Format::store(d, {Op::apply(a.lo, b.lo), Op::apply(a.hi, b.hi)});
}

// block(d, x, y) over n elements, kBlock at a time; the last partial block runs on zero-padded
// copies, so the block code never touches memory past n.
template <typename Block>
RT_AVX2 inline void by_blocks(uint16_t* d, const uint16_t* x, const uint16_t* y, size_t n, Block block) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) block(d + i, x + i, y + i);
  if (i < n) {
    uint16_t tx[kBlock] = {}, ty[kBlock] = {}, td[kBlock];
    const size_t bytes = (n - i) * sizeof(uint16_t);
    std::memcpy(tx, x + i, bytes);
    std::memcpy(ty, y + i, bytes);
    block(td, tx, ty);
    std::memcpy(d + i, td, bytes);
  }
}

template <typename Format, typename Op>
RT_AVX2 void reduce_half(void* dst, const void* a, const void* b, size_t n) {
  by_blocks(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
            [](uint16_t* d, const uint16_t* x, const uint16_t* y) RT_AVX2 { reduce_block<Format, Op>(d, x, y); });
}

// The element first, as the scalar map's v * factor: its NaN wins over a NaN factor (see Sum).
struct Multiply {
  RT_AVX2 static __m256d apply(__m256d v, __m256d k) {
    __m256d r;
    asm("vmulpd %2, %1, %0" : "=x"(r) : "x"(v), "xm"(k));
    return r;
  }
};
struct Divide {
  RT_AVX2 static __m256d apply(__m256d v, __m256d k) { return _mm256_div_pd(v, k); }
};

// float -> double -> (op k) -> float on 8 lanes.
template <typename Op>
RT_AVX2 inline __m256 map_in_double(__m256 v, __m256d k) {
  __m128 lo = _mm256_cvtpd_ps(Op::apply(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), k));
  __m128 hi = _mm256_cvtpd_ps(Op::apply(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), k));
  return _mm256_set_m128(hi, lo);
}

template <typename Format, typename Op>
RT_AVX2 inline void map_block(uint16_t* d, const uint16_t* s, __m256d k) {
  Wide v = Format::load(s);
  Format::store(d, {map_in_double<Op>(v.lo, k), map_in_double<Op>(v.hi, k)});
}

template <typename Format, typename Op>
RT_AVX2 void map_half(void* dst, const void* src, size_t n, double operand) {
  const __m256d k = _mm256_set1_pd(operand);
  const auto* s = static_cast<const uint16_t*>(src);
  by_blocks(static_cast<uint16_t*>(dst), s, s, n,
            [k](uint16_t* d, const uint16_t* x, const uint16_t*) RT_AVX2 { map_block<Format, Op>(d, x, k); });
}

template <typename Format>
ReduceFn pick(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return reduce_half<Format, Sum>;
    case ReduceOp::Prod:
      return reduce_half<Format, Prod>;
    case ReduceOp::Min:
      return reduce_half<Format, Min>;
    case ReduceOp::Max:
      return reduce_half<Format, Max>;
    default:
      return nullptr;
  }
}

}  // namespace

bool cpu_has_avx2_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

ReduceFn half_reduce_fn(DataType dtype, ReduceOp op) {
  return dtype == DataType::BFloat16 ? pick<BFloat16>(op) : pick<Float16>(op);
}

void half_scale(void* dst, const void* src, size_t count, DataType dtype, double factor) {
  if (dtype == DataType::BFloat16)
    map_half<BFloat16, Multiply>(dst, src, count, factor);
  else
    map_half<Float16, Multiply>(dst, src, count, factor);
}

void half_divide(void* dst, size_t count, DataType dtype, double divisor) {
  if (dtype == DataType::BFloat16)
    map_half<BFloat16, Divide>(dst, dst, count, divisor);
  else
    map_half<Float16, Divide>(dst, dst, count, divisor);
}

}  // namespace ringtree::x86

#endif  // __x86_64__
