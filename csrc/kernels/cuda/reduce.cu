// The CUDA reduce/copy kernels and their launchers (declared in reduce.h).
//
// One kernel template, elementwise_kernel<T, F>, serves every dtype and op: F is Combine<T, Op>
// for a reduction, Scale<T> for premul_sum and Divide<T> for avg. The launcher decides how the
// range splits into scalar head, 16-byte packs and scalar tail (see Split in reduce_device.cuh)
// and sizes the grid from the SM count, so one launch streams the whole range with grid-stride
// loops; a few blocks per SM keep enough 128-bit loads in flight to saturate HBM.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/reduce_device.cuh"

namespace ringtree {

namespace {

using cuda::bf16_t;
using cuda::f16_t;
using cuda::Split;
using cuda::with_storage_type;

constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 4;  // 2048 resident threads per SM on Hopper when <= 32 registers
// The launch bound promises only 2 resident blocks, i.e. up to 64 registers: the 16-element
// int8 packs and the double-precision divide of avg need more than 32 and would spill; every
// other instance compiles to <= 32 registers and still gets kBlocksPerSm blocks per SM.
constexpr int kMinBlocksPerSm = 2;

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    elementwise_kernel(T* dst, const T* a, const T* b, Split s, F f) {
  cuda::elementwise(dst, a, b, s, f);
}

int sm_count() {
  // Cached per device: asking the driver on every launch would cost more than small kernels.
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int dev = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) dev = 0;
  if (cached[dev] == 0) {
    int n = 0;
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cached[dev] = n > 0 ? n : 1;
  }
  return cached[dev];
}

template <typename T, typename F>
void launch(void* dst, const void* a, const void* b, size_t count, F f, cudaStream_t stream) {
  if (count == 0) return;
  const Split s = cuda::split_by_phase<T>(dst, a, b, count);
  const size_t work = s.packs + s.head + s.tail;  // upper bound on useful threads
  size_t blocks = (work + kThreads - 1) / kThreads;
  const size_t max_blocks = static_cast<size_t>(sm_count()) * kBlocksPerSm;
  if (blocks > max_blocks) blocks = max_blocks;
  T* out = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  Split split = s;
  void* args[] = {&out, &x, &y, &split, &f};
  RT_CUDA_CHECK(
      cudaLaunchKernel(elementwise_kernel<T, F>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), args, 0, stream));
}

// fn(T{}) for every storage type.
template <typename Fn>
void with_storage_type_each(Fn&& fn) {
  for (int d = 0; d < static_cast<int>(DataType::Count); ++d) with_storage_type(static_cast<DataType>(d), fn);
}

template <typename Op>
void reduce_with(void* dst, const void* a, const void* b, size_t count, DataType dtype, cudaStream_t stream) {
  cuda::for_op_types<Op>(dtype, [&](auto tag) {
    using T = decltype(tag);
    launch<T>(dst, a, b, count, cuda::Combine<T, Op>{}, stream);
  });
}

}  // namespace

void cuda_reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                 cudaStream_t stream) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
    case ReduceOp::PremulSum:
      return reduce_with<cuda::OpSum>(dst, a, b, count, dtype, stream);
    case ReduceOp::Prod:
      return reduce_with<cuda::OpProd>(dst, a, b, count, dtype, stream);
    case ReduceOp::Min:
      return reduce_with<cuda::OpMin>(dst, a, b, count, dtype, stream);
    case ReduceOp::Max:
      return reduce_with<cuda::OpMax>(dst, a, b, count, dtype, stream);
    case ReduceOp::BitAnd:
      return reduce_with<cuda::OpBitAnd>(dst, a, b, count, dtype, stream);
    case ReduceOp::BitOr:
      return reduce_with<cuda::OpBitOr>(dst, a, b, count, dtype, stream);
    case ReduceOp::BitXor:
      return reduce_with<cuda::OpBitXor>(dst, a, b, count, dtype, stream);
    default:
      RT_THROW(InvalidArgument, "unsupported reduce op code ", static_cast<int>(op));
  }
}

void cuda_scale(void* dst, const void* src, size_t count, DataType dtype, double factor, cudaStream_t stream) {
  const uint64_t int_factor = static_cast<uint64_t>(static_cast<int64_t>(factor));
  with_storage_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    launch<T>(dst, src, src, count, cuda::Scale<T>{factor, int_factor}, stream);
  });
}

void cuda_divide(void* dst, size_t count, DataType dtype, int64_t divisor, cudaStream_t stream) {
  RT_CHECK(divisor != 0, InvalidArgument, "cuda_divide: divisor must not be zero");
  with_storage_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    launch<T>(dst, dst, dst, count, cuda::Divide<T>{divisor}, stream);
  });
}

void load_reduce_kernels() {
  cudaFuncAttributes attr;
  cuda::for_each_op_and_type([&](auto op, auto tag) {
    using T = decltype(tag);
    RT_CUDA_CHECK(cudaFuncGetAttributes(&attr, elementwise_kernel<T, cuda::Combine<T, decltype(op)>>));
  });
  with_storage_type_each([&](auto tag) {
    using T = decltype(tag);
    RT_CUDA_CHECK(cudaFuncGetAttributes(&attr, elementwise_kernel<T, cuda::Scale<T>>));
    RT_CUDA_CHECK(cudaFuncGetAttributes(&attr, elementwise_kernel<T, cuda::Divide<T>>));
  });
}

void cuda_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return;
  RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace ringtree
