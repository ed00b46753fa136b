// The stand-in build's device code for the device executors: launch.cu itself, compiled for the
// CPU through the CUDA-on-CPU layer.
#include "kernels/cuda/standin/cuda_on_cpu.h"
#include "exec/cuda/launch.cu"
