// The CUDA-on-CPU layer's <cuda_fp16.h>: the half-precision conversions device code uses, with
// the GPU's rounding (to nearest even) and its canonical NaN (0x7fff) for a NaN input.
#pragma once
#include <cstdint>
#include "kernels/host/reduce.h"

struct __half {
  unsigned short x;
};

inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline float __half2float(__half h) { return ::ringtree::half_to_float(h.x); }
inline __half __float2half_rn(float f) {
  return __half{static_cast<unsigned short>(f != f ? 0x7fffu : ::ringtree::float_to_half(f))};
}
