// Communicator and Work. Every call that can block releases the GIL.
#include <pybind11/stl.h>
#include <vector>
#include "bindings/bindings.h"
#include "common/check.h"
#include "ringtree/communicator.h"

namespace py = pybind11;

namespace ringtree {

namespace {

Buffer make_buffer(bool present, uintptr_t ptr, uint64_t count, bool readonly) {
  Buffer b;
  b.present = present;
  b.ptr = reinterpret_cast<void*>(ptr);
  b.count = count;
  b.readonly = readonly;
  return b;
}

template <typename E>
E checked_enum(int code, E count, const char* what) {
  RT_CHECK(code >= 0 && code < static_cast<int>(count), InvalidArgument, "unknown ", what, " code ", code);
  return static_cast<E>(code);
}

}  // namespace

void register_communicator(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", &Work::wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>())
      .def("is_completed", &Work::is_completed);

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def(py::init([](int rank, int size, const UniqueId& uid, double timeout) {
             return Communicator::create(rank, size, uid, timeout);
           }),
           py::arg("rank"), py::arg("size"), py::arg("unique_id"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("default_timeout", &Communicator::default_timeout)
      .def(
          "run",
          [](Communicator& c, int coll, int dtype, bool has_in, uintptr_t in_ptr, uint64_t in_count, bool in_ro,
             bool has_out, uintptr_t out_ptr, uint64_t out_count, bool out_ro, int op, double factor, int root,
             int peer, int algo, double timeout, bool async_op, std::vector<uint64_t> send_counts,
             std::vector<uint64_t> recv_counts, int recv_peer) {
            CollectiveArgs a;
            a.coll = checked_enum(coll, Collective::Count, "collective");
            a.dtype = checked_enum(dtype, DataType::Count, "dtype");
            a.input = make_buffer(has_in, in_ptr, in_count, in_ro);
            a.output = make_buffer(has_out, out_ptr, out_count, out_ro);
            a.op = checked_enum(op, ReduceOp::Count, "reduce op");
            a.premul_factor = factor;
            a.root = root;
            a.peer = peer;
            a.algo = checked_enum(algo, Algo::Count, "algo");
            a.timeout_s = timeout;
            a.send_counts = std::move(send_counts);
            a.recv_counts = std::move(recv_counts);
            a.recv_peer = recv_peer;
            return c.run(a, async_op);
          },
          py::arg("coll"), py::arg("dtype"), py::arg("has_in"), py::arg("in_ptr"), py::arg("in_count"), py::arg("in_ro"),
          py::arg("has_out"), py::arg("out_ptr"), py::arg("out_count"), py::arg("out_ro"), py::arg("op"), py::arg("factor"),
          py::arg("root"), py::arg("peer"), py::arg("algo"), py::arg("timeout"), py::arg("async_op"),
          py::arg("send_counts") = std::vector<uint64_t>{}, py::arg("recv_counts") = std::vector<uint64_t>{},
          py::arg("recv_peer") = -1,
          py::call_guard<py::gil_scoped_release>())
      .def("choose_algo",
           [](Communicator& c, int coll, int algo, uint64_t bytes) {
             return static_cast<int>(c.choose_algo(checked_enum(coll, Collective::Count, "collective"),
                                                   checked_enum(algo, Algo::Count, "algo"), bytes));
           })
      .def("transport_to", &Communicator::transport_to)
      .def("close", &Communicator::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("is_aborted", &Communicator::is_aborted);
}

}  // namespace ringtree
