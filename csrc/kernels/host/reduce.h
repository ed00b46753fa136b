// Host reduce/copy kernels. dst = a (op) b elementwise; dst may alias a or b.
// Half types (float16, bfloat16) are widened to float32, reduced, and rounded back (RNE).
#pragma once
#include <cstddef>
#include <cstdint>
#include "ringtree/types.h"

namespace ringtree {

using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// For Sum/Prod/Min/Max and the bitwise ops (integer dtypes). Avg and PremulSum reduce with Sum; their scaling is a
// separate pass.
ReduceFn reduce_fn(DataType dtype, ReduceOp op);
// dst[i] = src[i] * factor (factor converted to the element type's arithmetic).
void scale_elements(void* dst, const void* src, size_t count, DataType dtype, double factor);
// dst[i] = dst[i] / divisor; integers truncate toward zero (as C and NCCL do).
void divide_elements(void* dst, size_t count, DataType dtype, int64_t divisor);

// The instruction set the half-precision kernels use, chosen once per process: "avx2+f16c" or
// "scalar" (RINGTREE_KERNEL_ISA=scalar forces the latter).
const char* kernel_isa_name();

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

}  // namespace ringtree
