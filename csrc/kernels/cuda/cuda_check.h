// Host-side CUDA error checks: every runtime call's status becomes a ringtree::Error whose
// message names the call and cudaGetErrorString's text, so Python sees ringtree.Error.
#pragma once
#include "kernels/cuda/cuda_api.h"
#include <cstdint>
#include <string>
#include "common/check.h"

namespace ringtree {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(str_cat("CUDA error in ", call, " (", file, ":", line, "): ", cudaGetErrorName(err), ": ",
                      cudaGetErrorString(err)));
}

// Throws InvalidArgument unless [ptr, ptr + bytes) starts in device (or managed) memory of
// `device`: catches host pointers and buffers of another GPU before anything is enqueued.
// `what` names the buffer in the message; `device_hint` follows the wrong-device message.
void check_device_buffer(uintptr_t ptr, uint64_t bytes, int device, const std::string& what,
                         const char* device_hint = "");

}  // namespace ringtree

#define RT_CUDA_CHECK(call)                                                                       \
  do {                                                                                            \
    cudaError_t rt_err_ = (call);                                                                 \
    if (rt_err_ != cudaSuccess) ::ringtree::throw_cuda_error(rt_err_, #call, __FILE__, __LINE__); \
  } while (0)
