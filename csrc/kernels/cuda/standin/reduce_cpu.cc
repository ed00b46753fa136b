// The stand-in build's reduce/scale/divide kernels: reduce.cu itself, compiled for the CPU
// through the CUDA-on-CPU layer.
#include "kernels/cuda/standin/cuda_on_cpu.h"
#include "kernels/cuda/reduce.cu"
