// The test module's hooks into the CUDA stand-in (kernels/cuda/standin/cuda_runtime.h): what a
// CUDA build's tests get from torch or cupy (device memory, copies, a kernel that keeps a stream
// busy, streams, devices), and what only the stand-in can tell (which devices got a context,
// what was undefined behaviour).
#include <pybind11/stl.h>
#include <chrono>
#include <thread>
#include "bindings/testing/testing.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace py = pybind11;

namespace ringtree {

namespace {

// Makes `device` current for the scope (>= 0), as torch's device guard.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    RT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device >= 0 && device != previous_) {
      RT_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~OnDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

void register_standin_hooks(py::module_& m) {
  m.def(
      "standin_malloc",
      [](size_t bytes, int device) {
        OnDevice on(device);
        void* p = nullptr;
        RT_CUDA_CHECK(cudaMalloc(&p, bytes));
        return reinterpret_cast<uintptr_t>(p);
      },
      py::arg("bytes"), py::arg("device") = -1,
      "cudaMalloc on `device` (default: the current one): device memory (a shared mapping) as an int; 0 for 0 bytes.");
  m.def(
      "standin_free", [](uintptr_t p) { RT_CUDA_CHECK(cudaFree(reinterpret_cast<void*>(p))); }, py::arg("ptr"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "standin_memcpy",
      [](uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream, bool wait) {
        RT_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                                      cudaMemcpyDefault, stream_of(stream)));
        if (wait) RT_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream)));
      },
      py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("stream") = 0, py::arg("wait") = true,
      py::call_guard<py::gil_scoped_release>(),
      "Copy on `stream`, after what is queued there; wait for it unless wait=False (then both buffers must\n"
      "outlive the copy).");
  m.def(
      "standin_sleep",
      [](double seconds, uintptr_t stream) {
        RT_CUDA_CHECK(standin::enqueue(
            stream_of(stream), [seconds] { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }));
      },
      py::arg("seconds"), py::arg("stream") = 0, "Enqueue work that keeps `stream` busy for `seconds`.");
  m.def(
      "standin_stream_synchronize", [](uintptr_t stream) { RT_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream))); },
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def("standin_stream_create", []() {
    cudaStream_t s = nullptr;
    RT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return reinterpret_cast<uintptr_t>(s);
  });
  m.def(
      "standin_stream_destroy", [](uintptr_t s) { RT_CUDA_CHECK(cudaStreamDestroy(stream_of(s))); }, py::arg("stream"));
  m.def(
      "standin_begin_capture",
      [](uintptr_t s) { RT_CUDA_CHECK(cudaStreamBeginCapture(stream_of(s), cudaStreamCaptureModeGlobal)); },
      py::arg("stream"), "cudaStreamBeginCapture: what is enqueued on `stream` from now on goes into a graph.");
  m.def(
      "standin_end_capture",
      [](uintptr_t s) {
        cudaGraph_t g = nullptr;
        RT_CUDA_CHECK(cudaStreamEndCapture(stream_of(s), &g));
        return reinterpret_cast<uintptr_t>(g);
      },
      py::arg("stream"), "cudaStreamEndCapture: the captured graph, as an int.");
  m.def(
      "standin_graph_nodes",
      [](uintptr_t g) {
        size_t n = 0;
        RT_CUDA_CHECK(cudaGraphGetNodes(reinterpret_cast<cudaGraph_t>(g), nullptr, &n));
        return n;
      },
      py::arg("graph"), "How many operations the graph holds.");
  m.def(
      "standin_graph_launch",
      [](uintptr_t g, uintptr_t s) {
        cudaGraphExec_t exec = nullptr;
        RT_CUDA_CHECK(cudaGraphInstantiate(&exec, reinterpret_cast<cudaGraph_t>(g), 0));
        const cudaError_t err = cudaGraphLaunch(exec, stream_of(s));
        (void)cudaGraphExecDestroy(exec);
        RT_CUDA_CHECK(err);
      },
      py::arg("graph"), py::arg("stream"), "Instantiate the graph and launch it on `stream` (a replay).");
  m.def(
      "standin_graph_destroy", [](uintptr_t g) { RT_CUDA_CHECK(cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(g))); },
      py::arg("graph"));
  m.def(
      "standin_set_device", [](int device) { RT_CUDA_CHECK(cudaSetDevice(device)); }, py::arg("device"),
      "cudaSetDevice for the calling thread (torch.cuda.set_device's equivalent).");
  m.def("standin_get_device", []() {
    int d = 0;
    RT_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  });
  m.def(
      "standin_device_of", [](uintptr_t p) { return standin::device_of(reinterpret_cast<const void*>(p)); },
      py::arg("ptr"), "The device an allocation lives on (-1: not device memory).");
  m.def("standin_contexts", &standin::contexts, "The devices on which this process has a context, sorted.");
  m.def("standin_schedule", &cuda_on_cpu::set_schedule, py::arg("seed"), py::arg("yield_percent") = 0,
        "How blocks launched from now on order their threads (seed 0: in thread order) and how often they\n"
        "hand over at fences, atomics and __ldcg (percent), as RINGTREE_STANDIN_SEED / _YIELD.");
  m.def("standin_clear_fault", &cuda_on_cpu::clear_fault,
        "Forget a kernel fault (the sticky error): for tests that provoke one on purpose.");
  m.def("standin_violations", &standin::violations,
        "What this process did that is undefined behaviour on a GPU (freeing memory other processes map).");
}

}  // namespace ringtree
