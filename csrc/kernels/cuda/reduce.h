// Host launchers of the CUDA reduce/copy kernels (the device code is in reduce_device.cuh and
// reduce.cu). Each call only enqueues on `stream` and returns; errors in the launch itself are
// thrown as ringtree::Error, errors during execution surface at the next synchronisation.
//
// Pointers are device pointers on the current device. Semantics are those of the host kernels
// in kernels/reduce.h: dst = a (op) b elementwise, dst may alias a or b; Avg and PremulSum
// reduce with Sum (their scaling is cuda_scale / cuda_divide); half types compute in float.
#pragma once
#include "kernels/cuda/cuda_api.h"
#include <cstddef>
#include <cstdint>
#include "ringtree/types.h"

namespace ringtree {

void cuda_reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                 cudaStream_t stream);
// dst[i] = src[i] * factor (see kernels/reduce.h scale_elements for the per-type rules).
void cuda_scale(void* dst, const void* src, size_t count, DataType dtype, double factor, cudaStream_t stream);
// dst[i] = dst[i] / divisor; integers truncate toward zero.
void cuda_divide(void* dst, size_t count, DataType dtype, int64_t divisor, cudaStream_t stream);
// dst = src, `bytes` bytes, device to device (the copy engine or the driver's copy kernel).
void cuda_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);
// Loads every instance of the kernels above on the current device (see load_device_kernels in
// exec/cuda/launch.h for why).
void load_reduce_kernels();

}  // namespace ringtree
