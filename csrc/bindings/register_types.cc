// Names of the enums, in code order, so Python maps names to codes without a second table.
#include <pybind11/stl.h>
#include "bindings/bindings.h"
#include "ringtree/types.h"
#include "ringtree/unique_id.h"

namespace py = pybind11;

namespace ringtree {

void register_types(py::module_& m) {
  std::vector<std::string> dtypes, ops, colls, algos;
  for (int i = 0; i < static_cast<int>(DataType::Count); ++i) dtypes.push_back(dtype_name(static_cast<DataType>(i)));
  for (int i = 0; i < static_cast<int>(ReduceOp::Count); ++i) ops.push_back(op_name(static_cast<ReduceOp>(i)));
  for (int i = 0; i < static_cast<int>(Collective::Count); ++i) colls.push_back(collective_name(static_cast<Collective>(i)));
  for (int i = 0; i < static_cast<int>(Algo::Count); ++i) algos.push_back(algo_name(static_cast<Algo>(i)));
  m.attr("DTYPES") = dtypes;
  m.attr("OPS") = ops;
  m.attr("COLLECTIVES") = colls;
  m.attr("ALGOS") = algos;

  py::class_<UniqueId>(m, "UniqueId", "The job's rendezvous token (rank 0's address, port and a 128-bit secret).")
      .def_static("create", &UniqueId::create, "Reserve a port on this host and make a fresh secret.")
      .def_static("parse", &UniqueId::parse, py::arg("token"), "Read back a token made by str(uid).")
      .def_static("from_seed", &UniqueId::from_seed, py::arg("ip"), py::arg("port"), py::arg("seed"))
      .def_readonly("ip", &UniqueId::ip)
      .def_readonly("port", &UniqueId::port)
      .def("__str__", &UniqueId::str)
      .def("__repr__", [](const UniqueId& u) { return "UniqueId('" + u.ip + ":" + std::to_string(u.port) + "')"; })
      .def("take_listener", [](const UniqueId& u) { return take_reserved_listener(u.port); },
           "Hand over the listening socket create() reserved (-1 if none), e.g. to pass to rank 0's process.")
      .def("__eq__", [](const UniqueId& a, const UniqueId& b) { return a.str() == b.str(); });
}

}  // namespace ringtree
