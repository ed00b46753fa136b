// AVX2 + F16C kernels for float16 and bfloat16 (reduce_x86.cc), bit-identical to the scalar
// ones in reduce.cc. Call them only where cpu_has_avx2_f16c(); reduce.cc chooses once per process.
#pragma once
#if defined(__x86_64__)
#include "kernels/host/reduce.h"

namespace ringtree::x86 {

bool cpu_has_avx2_f16c();
// dtype: Float16 or BFloat16; op: Sum, Prod, Min or Max.
ReduceFn half_reduce_fn(DataType dtype, ReduceOp op);
// dst[i] = half(float(float(src[i]) * factor)), the product taken in double as scale_elements does.
void half_scale(void* dst, const void* src, size_t count, DataType dtype, double factor);
// dst[i] = half(float(float(dst[i]) / divisor)), the quotient taken in double as divide_elements does.
void half_divide(void* dst, size_t count, DataType dtype, double divisor);

}  // namespace ringtree::x86
#endif
