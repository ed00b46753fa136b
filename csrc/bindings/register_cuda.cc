// The CUDA path's Python entry points. They exist in every build: without CUDA
// (RINGTREE_HAVE_CUDA undefined) cuda_built() and cuda_available() return False and every
// other function raises ringtree.Error saying how to get a CUDA build, so callers need no
// import-time feature checks. The test module compiles this file once more over the CUDA
// stand-in (RINGTREE_CUDA_STANDIN), where everything is there.
//
// Device buffers travel as raw pointers (cupy: a.data.ptr, torch: t.data_ptr()), streams as
// integers (cupy: stream.ptr, torch: torch.cuda.current_stream().cuda_stream; 0 = the legacy
// default stream). Every call that can wait releases the GIL.
#include <pybind11/stl.h>
#include <string>
#include <vector>
#include "bindings/bindings.h"
#include "common/check.h"
#include "ringtree/types.h"
#include "ringtree/communicator.h"
#include "transport/nccl/nccl_library.h"
#if defined(RINGTREE_HAVE_CUDA) || defined(RINGTREE_CUDA_STANDIN)
#define RINGTREE_DEVICE_PATH 1
#include "exec/cuda/device_comm.h"
#include "exec/cuda/local_executor.h"
#endif

namespace py = pybind11;

namespace ringtree {

namespace {

template <typename E>
E checked_code(int code, E count, const char* what) {
  RT_CHECK(code >= 0 && code < static_cast<int>(count), InvalidArgument, "unknown ", what, " code ", code);
  return static_cast<E>(code);
}

constexpr const char* kRunDoc =
    "Enqueue one collective over P 'thread ranks' sharing the current GPU and return at once.\n"
    "coll/algo/dtype/op are codes (indices into COLLECTIVES, ALGOS, DTYPES, OPS); count is the\n"
    "schedule count (whole buffer for all_reduce/broadcast/reduce, per-rank block otherwise);\n"
    "input_ptrs/output_ptrs hold one device pointer per rank (0 where a rank needs none);\n"
    "stream is the caller's cudaStream_t as an int. Returns a dict of what was enqueued.";

constexpr const char* kCudaCommDoc =
    "Collectives on CUDA device buffers for a host Communicator's ranks: staged through pinned host\n"
    "memory (the default) or handed to NCCL (use_nccl). Enqueued on the caller's stream.";

// NCCL's version and file, or an Error saying what was tried. Works in every build: NCCL is
// loaded at run time.
py::dict nccl_library(const std::string& wheel_hint) {
  std::string why;
  const NcclApi* api = nullptr;
  {
    py::gil_scoped_release release;
    api = nccl_api(wheel_hint, &why);
  }
  if (!api) throw Error(why);
  py::dict d;
  d["version"] = api->version;
  d["path"] = api->path;
  return d;
}

#ifdef RINGTREE_DEVICE_PATH

// Collectives on device buffers for a host communicator (CUDA builds and the stand-in).
void register_device_comm(py::module_& m) {
  m.def("cuda_built", []() { return true; }, "True when this build contains the CUDA path.");
  py::class_<DeviceWork, std::shared_ptr<DeviceWork>>(m, "DeviceWork")
      .def("wait", &DeviceWork::wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>())
      .def("is_completed", &DeviceWork::is_completed);
  py::class_<CudaComm, std::shared_ptr<CudaComm>>(m, "CudaComm", kCudaCommDoc)
      .def(py::init([](std::shared_ptr<Communicator> host, std::string nccl_hint) {
             return CudaComm::create(std::move(host), std::move(nccl_hint));
           }),
           py::arg("host"), py::arg("nccl_hint") = "", py::call_guard<py::gil_scoped_release>())
      .def(
          "run",
          [](CudaComm& c, int coll, int dtype, bool has_in, uintptr_t in_ptr, uint64_t in_count, bool in_ro,
             bool has_out, uintptr_t out_ptr, uint64_t out_count, bool out_ro, int op, double factor, int root,
             int peer, int recv_peer, int algo, double timeout, uintptr_t stream, bool use_nccl, bool async_op,
             std::vector<uint64_t> send_counts, std::vector<uint64_t> recv_counts, bool deterministic) {
            CollectiveArgs a;
            a.coll = checked_code(coll, Collective::Count, "collective");
            a.dtype = checked_code(dtype, DataType::Count, "dtype");
            a.op = checked_code(op, ReduceOp::Count, "reduce op");
            a.algo = checked_code(algo, Algo::Count, "algo");
            a.premul_factor = factor;
            a.root = root;
            a.peer = peer;
            a.recv_peer = recv_peer;
            a.timeout_s = timeout;
            a.input = {reinterpret_cast<void*>(in_ptr), in_count, in_ro, has_in};
            a.output = {reinterpret_cast<void*>(out_ptr), out_count, out_ro, has_out};
            a.send_counts = std::move(send_counts);
            a.recv_counts = std::move(recv_counts);
            a.deterministic = deterministic;
            return c.run(a, stream, use_nccl, async_op);
          },
          py::arg("coll"), py::arg("dtype"), py::arg("has_in"), py::arg("in_ptr"), py::arg("in_count"),
          py::arg("in_ro"), py::arg("has_out"), py::arg("out_ptr"), py::arg("out_count"), py::arg("out_ro"),
          py::arg("op"), py::arg("factor"), py::arg("root"), py::arg("peer"), py::arg("recv_peer"), py::arg("algo"),
          py::arg("timeout"), py::arg("stream"), py::arg("use_nccl"), py::arg("async_op"),
          py::arg("send_counts") = std::vector<uint64_t>{}, py::arg("recv_counts") = std::vector<uint64_t>{},
          py::arg("deterministic") = false, py::call_guard<py::gil_scoped_release>())
      .def("executor", &CudaComm::executor)
      .def("close", &CudaComm::close, py::call_guard<py::gil_scoped_release>());
  m.def(
      "cuda_available", []() { return cuda_runtime_available(); },
      "True when the CUDA path is built and the CUDA runtime finds a device.");
  m.def("cuda_unavailable_reason", []() {
    std::string reason;
    return cuda_runtime_available(&reason) ? std::string() : reason;
  });
  m.def("cuda_device_count", &cuda_device_count);
}

#else

[[noreturn]] void no_cuda(const char* what) {
  RT_THROW(Error, what,
           ": this ringtree was built without CUDA (RINGTREE_CUDA=OFF, or no CUDA compiler was found "
           "at build time); rebuild with RINGTREE_CUDA=ON and CMAKE_CUDA_ARCHITECTURES set for your GPU");
}

struct NoCudaComm {};

void register_device_comm(py::module_& m) {
  m.def("cuda_built", []() { return false; }, "True when this build contains the CUDA path.");
  py::class_<NoCudaComm>(m, "CudaComm", kCudaCommDoc)
      .def(py::init([](py::object, std::string) -> NoCudaComm* { no_cuda("CUDA device buffers"); }), py::arg("host"),
           py::arg("nccl_hint") = "");
  m.def(
      "cuda_available", []() { return false; },
      "True when the CUDA path is built and the CUDA runtime finds a device.");
  m.def("cuda_unavailable_reason", []() { return std::string("ringtree was built without CUDA"); });
  m.def("cuda_device_count", []() { return 0; });
}

#endif

}  // namespace

#ifdef RINGTREE_DEVICE_PATH

// The thread ranks on one GPU and the kernels alone (CUDA builds and the stand-in).
void register_thread_ranks(py::module_& m) {
  m.def(
      "cuda_local_run",
      [](int coll, int algo, int dtype, int op, double premul_factor, int root, uint64_t count,
         std::vector<uintptr_t> input_ptrs, std::vector<uintptr_t> output_ptrs, uintptr_t stream,
         uint64_t segment_bytes) {
        CudaLocalArgs a;
        a.coll = checked_code(coll, Collective::Count, "collective");
        a.algo = checked_code(algo, Algo::Count, "algo");
        a.dtype = checked_code(dtype, DataType::Count, "dtype");
        a.op = checked_code(op, ReduceOp::Count, "reduce op");
        a.premul_factor = premul_factor;
        a.root = root;
        a.count = count;
        a.inputs = std::move(input_ptrs);
        a.outputs = std::move(output_ptrs);
        a.stream = stream;
        a.segment_bytes = segment_bytes;
        const CudaLocalStats s = cuda_local_run(a);
        py::gil_scoped_acquire gil;
        py::dict d;
        d["transfers"] = s.transfers;
        d["copies"] = s.copies;
        d["kernels"] = s.kernels;
        d["events"] = s.events;
        d["hbm_bytes"] = s.hbm_bytes;
        return d;
      },
      py::arg("coll"), py::arg("algo"), py::arg("dtype"), py::arg("op"), py::arg("premul_factor"), py::arg("root"),
      py::arg("count"), py::arg("input_ptrs"), py::arg("output_ptrs"), py::arg("stream") = 0,
      py::arg("segment_bytes") = 0, py::call_guard<py::gil_scoped_release>(), kRunDoc);
  m.def("cuda_synchronize", &cuda_local_synchronize, py::call_guard<py::gil_scoped_release>(),
        "Wait for everything cuda_local_run enqueued on the current device; raise its CUDA errors.");
  m.def(
      "cuda_kernel_reduce",
      [](uintptr_t dst, uintptr_t a, uintptr_t b, uint64_t count, int dtype, int op, uintptr_t stream) {
        cuda_kernel_reduce(dst, a, b, count, checked_code(dtype, DataType::Count, "dtype"),
                           checked_code(op, ReduceOp::Count, "reduce op"), stream);
      },
      py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>(), "Enqueue dst = a (op) b on stream.");
  m.def(
      "cuda_kernel_scale",
      [](uintptr_t dst, uintptr_t src, uint64_t count, int dtype, double factor, uintptr_t stream) {
        cuda_kernel_scale(dst, src, count, checked_code(dtype, DataType::Count, "dtype"), factor, stream);
      },
      py::arg("dst"), py::arg("src"), py::arg("count"), py::arg("dtype"), py::arg("factor"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(), "Enqueue dst = src * factor (premul_sum's pass) on stream.");
  m.def(
      "cuda_kernel_divide",
      [](uintptr_t dst, uint64_t count, int dtype, int64_t divisor, uintptr_t stream) {
        cuda_kernel_divide(dst, count, checked_code(dtype, DataType::Count, "dtype"), divisor, stream);
      },
      py::arg("dst"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(), "Enqueue dst = dst / divisor (avg's pass) on stream.");
  m.def("cuda_stream_synchronize", &cuda_stream_synchronize, py::arg("stream") = 0,
        py::call_guard<py::gil_scoped_release>());
}

#else

// Same names as in CUDA builds, so callers need no feature check: using them explains.
void register_thread_ranks(py::module_& m) {
  m.def(
      "cuda_local_run",
      [](int, int, int, int, double, int, uint64_t, std::vector<uintptr_t>, std::vector<uintptr_t>, uintptr_t,
         uint64_t) -> py::dict { no_cuda("cuda_local_run"); },
      py::arg("coll"), py::arg("algo"), py::arg("dtype"), py::arg("op"), py::arg("premul_factor"), py::arg("root"),
      py::arg("count"), py::arg("input_ptrs"), py::arg("output_ptrs"), py::arg("stream") = 0,
      py::arg("segment_bytes") = 0, kRunDoc);
  m.def("cuda_synchronize", []() { no_cuda("cuda_synchronize"); });
  m.def(
      "cuda_kernel_reduce",
      [](uintptr_t, uintptr_t, uintptr_t, uint64_t, int, int, uintptr_t) { no_cuda("cuda_kernel_reduce"); },
      py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("stream") = 0);
  m.def(
      "cuda_kernel_scale", [](uintptr_t, uintptr_t, uint64_t, int, double, uintptr_t) { no_cuda("cuda_kernel_scale"); },
      py::arg("dst"), py::arg("src"), py::arg("count"), py::arg("dtype"), py::arg("factor"), py::arg("stream") = 0);
  m.def(
      "cuda_kernel_divide", [](uintptr_t, uint64_t, int, int64_t, uintptr_t) { no_cuda("cuda_kernel_divide"); },
      py::arg("dst"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("stream") = 0);
  m.def("cuda_stream_synchronize", [](uintptr_t) { no_cuda("cuda_stream_synchronize"); }, py::arg("stream") = 0);
}

#endif

void register_cuda(py::module_& m) {
  m.def("nccl_library", &nccl_library, py::arg("wheel_hint") = "",
        "Load NCCL (once per process) and return {'version', 'path'}; raises Error saying what was tried.");
  register_device_comm(m);
  register_thread_ranks(m);
}

}  // namespace ringtree
