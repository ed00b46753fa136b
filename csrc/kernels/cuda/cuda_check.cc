#include "kernels/cuda/cuda_check.h"
#include <cstdio>

namespace ringtree {

namespace {

std::string hex(uintptr_t p) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

const char* memory_type_name(cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered:
      return "unregistered host memory";
    case cudaMemoryTypeHost:
      return "pinned host memory";
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeManaged:
      return "managed memory";
    default:
      return "unknown memory";
  }
}

}  // namespace

void check_device_buffer(uintptr_t ptr, uint64_t bytes, int device, const std::string& what, const char* device_hint) {
  if (bytes == 0) return;
  RT_CHECK(ptr != 0, InvalidArgument, what, " is null but holds ", bytes, " bytes");
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error
    RT_THROW(InvalidArgument, what, " = ", hex(ptr), " is not a CUDA pointer (", cudaGetErrorString(err), ")");
  }
  RT_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged, InvalidArgument, what, " = ",
           hex(ptr), " is ", memory_type_name(attr.type), ", not device memory");
  RT_CHECK(attr.type == cudaMemoryTypeManaged || attr.device == device, InvalidArgument, what, " lives on device ",
           attr.device, " but the current device is ", device, device_hint);
}

}  // namespace ringtree
