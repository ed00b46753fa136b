// The stand-in build's reduce/scale/divide/copy launchers (kernels/cuda/reduce.h): the host
// kernels (kernels/host/reduce.h) as closures on the stand-in stream's thread.
#include <cstring>
#include "common/check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce.h"
#include "kernels/host/reduce.h"

namespace ringtree {

void cuda_reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                 cudaStream_t stream) {
  const ReduceFn fn = reduce_fn(dtype, op);
  RT_CUDA_CHECK(standin::enqueue(stream, [=] { fn(dst, a, b, count); }));
}

void cuda_scale(void* dst, const void* src, size_t count, DataType dtype, double factor, cudaStream_t stream) {
  RT_CUDA_CHECK(standin::enqueue(stream, [=] { scale_elements(dst, src, count, dtype, factor); }));
}

void cuda_divide(void* dst, size_t count, DataType dtype, int64_t divisor, cudaStream_t stream) {
  RT_CHECK(divisor != 0, InvalidArgument, "cuda_divide: divisor must not be zero");
  RT_CUDA_CHECK(standin::enqueue(stream, [=] { divide_elements(dst, count, dtype, divisor); }));
}

void cuda_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return;
  RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace ringtree
