// The CUDA-on-CPU layer's <cuda_bf16.h>: the bfloat16 conversions device code uses, with the
// GPU's rounding (to nearest even) and its canonical NaN (0x7fff) for a NaN input.
#pragma once
#include <cstdint>
#include "kernels/host/reduce.h"

struct __nv_bfloat16 {
  unsigned short x;
};

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline float __bfloat162float(__nv_bfloat16 h) { return ::ringtree::bf16_to_float(h.x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16{static_cast<unsigned short>(f != f ? 0x7fffu : ::ringtree::float_to_bf16(f))};
}
