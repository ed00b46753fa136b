// What tests need besides the API to drive the stand-in module (ringtree._core_standin): device
// memory, copies in and out on a stream, a kernel that keeps a stream busy, stream
// synchronization. Only in the stand-in module; a CUDA build's tests use torch or cupy for these.
#include <chrono>
#include <thread>
#include "bindings/bindings.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace py = pybind11;

namespace ringtree {

void register_cuda_standin(py::module_& m) {
  m.attr("CUDA_STANDIN") = true;
  m.def(
      "standin_malloc",
      [](size_t bytes) {
        void* p = nullptr;
        RT_CUDA_CHECK(cudaMalloc(&p, bytes));
        return reinterpret_cast<uintptr_t>(p);
      },
      py::arg("bytes"), "cudaMalloc of the stand-in: device memory (a shared mapping) as an int; 0 for 0 bytes.");
  m.def(
      "standin_free", [](uintptr_t p) { RT_CUDA_CHECK(cudaFree(reinterpret_cast<void*>(p))); }, py::arg("ptr"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "standin_memcpy",
      [](uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream, bool wait) {
        auto s = reinterpret_cast<cudaStream_t>(stream);
        RT_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                                      cudaMemcpyDefault, s));
        if (wait) RT_CUDA_CHECK(cudaStreamSynchronize(s));
      },
      py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("stream") = 0, py::arg("wait") = true,
      py::call_guard<py::gil_scoped_release>(),
      "Copy on `stream`, after what is queued there; wait for it unless wait=False (then both buffers must\n"
      "outlive the copy).");
  m.def(
      "standin_sleep",
      [](double seconds, uintptr_t stream) {
        RT_CUDA_CHECK(ringtree::standin::enqueue(reinterpret_cast<cudaStream_t>(stream), [seconds] {
          std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        }));
      },
      py::arg("seconds"), py::arg("stream") = 0, "Enqueue a kernel that keeps `stream` busy for `seconds`.");
  m.def(
      "standin_stream_synchronize",
      [](uintptr_t stream) { RT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream))); },
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
}

}  // namespace ringtree
