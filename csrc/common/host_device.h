// RT_HOST_DEVICE marks a function that the host code and the CUDA kernels (nvcc, or the
// CUDA-on-CPU stand-in, which compiles the device sources as C++) share.
#pragma once

#if defined(__CUDACC__)
#define RT_HOST_DEVICE __host__ __device__
#else
#define RT_HOST_DEVICE
#endif
