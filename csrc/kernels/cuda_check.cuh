// Host-side CUDA error checks: every runtime call's status becomes a ringtree::Error whose
// message names the call and cudaGetErrorString's text, so Python sees ringtree.Error.
#pragma once
#include <cuda_runtime_api.h>
#include "common/check.h"

namespace ringtree {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(str_cat("CUDA error in ", call, " (", file, ":", line, "): ", cudaGetErrorName(err), ": ",
                      cudaGetErrorString(err)));
}

}  // namespace ringtree

#define RT_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    cudaError_t rt_err_ = (call);                                                    \
    if (rt_err_ != cudaSuccess) ::ringtree::throw_cuda_error(rt_err_, #call, __FILE__, __LINE__); \
  } while (0)
