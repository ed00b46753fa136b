// The CUDA runtime API as the host code of the device path calls it. A CUDA build gets the
// real runtime; the stand-in build (RINGTREE_CUDA_STANDIN: the private test module) gets
// kernels/cuda/standin/cuda_runtime.h, which serves the same calls on the CPU, so the executors'
// host side runs unchanged on machines without a GPU. Host code of the device path includes this
// header, never <cuda_runtime_api.h> directly.
#pragma once
#if defined(RINGTREE_CUDA_STANDIN)
#include "kernels/cuda/standin/cuda_runtime.h"
#else
#include <cuda_runtime_api.h>
#endif
