// Names of the enums, in code order, so Python maps names to codes without a second table.
#include <pybind11/stl.h>
#include "bindings/bindings.h"
#include "common/oneshot.h"
#include "common/collective.h"
#include "common/settings.h"
#include "ringtree/communicator.h"
#include "ringtree/types.h"
#include "ringtree/unique_id.h"

namespace py = pybind11;

namespace ringtree {

void register_types(py::module_& m) {
  std::vector<std::string> dtypes, ops, colls, algos;
  for (int i = 0; i < static_cast<int>(DataType::Count); ++i) dtypes.push_back(dtype_name(static_cast<DataType>(i)));
  for (int i = 0; i < static_cast<int>(ReduceOp::Count); ++i) ops.push_back(op_name(static_cast<ReduceOp>(i)));
  for (int i = 0; i < static_cast<int>(Collective::Count); ++i)
    colls.push_back(collective_name(static_cast<Collective>(i)));
  for (int i = 0; i < static_cast<int>(Algo::Count); ++i) algos.push_back(algo_name(static_cast<Algo>(i)));
  m.attr("DTYPES") = dtypes;
  m.attr("OPS") = ops;
  m.attr("COLLECTIVES") = colls;
  m.attr("ALGOS") = algos;
  // Message tags from here up are ringtree's own (shrink); the messenger's any-tag skips them.
  m.attr("FIRST_RESERVED_TAG") = kFirstReservedTag;
  m.attr("RESERVED_TAG_END") = kReservedTagEnd;
  // How many one-shot calls a broadcast or scatter root, a gather's or reduce's other ranks or a
  // count-0 call may run ahead (common/oneshot.h).
  m.attr("ONESHOT_RUN_AHEAD") = kOneShotRunAhead;
  m.attr("ONESHOT_SLOTS") = kOneShotSlots;
  m.attr("ONESHOT_INLINE_BYTES") = kOneShotInlineBytes;
  m.attr("ONESHOT_PAYLOAD_SLOTS") = kOneShotPayloadSlots;
  m.attr("ONESHOT_PAYLOAD_RUN_AHEAD") = kOneShotPayloadRunAhead;

  // The one description of each collective (common/collective.h), for the Python layer, the
  // bench and the tests: {name: {reduction, rooted, point_to_point, in_place, input_on_root,
  // output_on_root, input_elsewhere, output_elsewhere}}; multiples are "none", "one" (count
  // elements), "world" (count x P) or "free" (sizes given per call).
  static const char* in_place_names[] = {"none",       "same_buffer",           "staged_same_buffer",
                                         "one_buffer", "input_is_output_block", "output_is_input_block"};
  static const char* multiple_names[] = {"none", "one", "world", "free"};
  py::dict traits;
  for (int i = 0; i < static_cast<int>(Collective::Count); ++i) {
    const CollectiveTraits& t = collective_traits(static_cast<Collective>(i));
    py::dict d;
    d["reduction"] = t.reduction;
    d["rooted"] = t.rooted;
    d["point_to_point"] = t.point_to_point;
    d["in_place"] = in_place_names[static_cast<int>(t.in_place)];
    d["input_on_root"] = multiple_names[static_cast<int>(t.input_on_root)];
    d["output_on_root"] = multiple_names[static_cast<int>(t.output_on_root)];
    d["input_elsewhere"] = multiple_names[static_cast<int>(t.input_elsewhere)];
    d["output_elsewhere"] = multiple_names[static_cast<int>(t.output_elsewhere)];
    traits[collective_name(static_cast<Collective>(i))] = d;
  }
  m.attr("COLLECTIVE_TRAITS") = traits;

  // The settings table (common/settings.def), for the Python layer's own readers and the manual.
  py::list settings;
  for (int i = 0; i < static_cast<int>(Setting::Count); ++i) {
    const SettingInfo& info = setting_info(static_cast<Setting>(i));
    py::dict d;
    d["name"] = info.name;
    d["default"] = info.fallback;
    d["group"] = setting_group_title(info.group);
    d["text"] = info.text;
    settings.append(d);
  }
  m.attr("SETTINGS") = settings;
  m.def(
      "busbw_factor",
      [](int coll, int nranks) { return collective_traits(static_cast<Collective>(coll)).busbw_factor(nranks); },
      py::arg("coll"), py::arg("nranks"),
      "Bus bandwidth / algorithm bandwidth for a collective over nranks (nccl-tests).");
  m.def(
      "buffer_sizes",
      [](int coll, uint64_t count, int nranks, bool is_root) {
        const BufferSizes b = collective_traits(static_cast<Collective>(coll)).sizes(count, nranks, is_root);
        return py::make_tuple(b.input, b.output);
      },
      py::arg("coll"), py::arg("count"), py::arg("nranks"), py::arg("is_root") = true,
      "(input, output) element counts of one rank's buffers for a call of `count` (0: no such buffer).");

  py::class_<UniqueId>(m, "UniqueId", "The job's rendezvous token (rank 0's address, port and a 128-bit secret).")
      .def_static("create", &UniqueId::create, py::arg("ip") = std::string(),
                  "Reserve a port on this host (at ip, else RINGTREE_ADDR, else loopback) and make a fresh secret.\n\n"
                  "Parameters\n----------\nip : str\n    The IPv4 address or host name rank 0 listens at; empty: "
                  "RINGTREE_ADDR, else loopback.\n\n"
                  "Returns\n-------\nUniqueId\n    A new id whose port (RINGTREE_PORT, else any free one) stays bound "
                  "by this process until rank 0 takes it.\n\n"
                  "Raises\n------\nInvalidArgument\n    RINGTREE_PORT is out of range or the address does not resolve.")
      .def_static("parse", &UniqueId::parse, py::arg("token"),
                  "Read back a token made by str(uid).\n\n"
                  "Parameters\n----------\ntoken : str\n    rt1:<ipv4>:<port>:<32 hex digits>.\n\n"
                  "Returns\n-------\nUniqueId\n    The id the token names.\n\n"
                  "Raises\n------\nInvalidArgument\n    The token is malformed (its text is not echoed: it holds the "
                  "secret).")
      .def_static(
          "from_seed", &UniqueId::from_seed, py::arg("ip"), py::arg("port"), py::arg("seed"),
          py::arg("salt") = std::string(), py::call_guard<py::gil_scoped_release>(),
          "A unique id at ip:port whose secret is PBKDF2-HMAC-SHA256 of seed, salted with the port and salt.\n\n"
          "Every process that passes the same arguments gets the same id, so ranks can rendezvous without "
          "handing a token around.\n\n"
          "Parameters\n----------\nip : str\n    Rank 0's address.\nport : int\n    Rank 0's port, "
          "1..65535.\nseed : str\n    The shared secret phrase; not empty.\nsalt : str\n    Mixed into the "
          "key derivation with the port.\n\n"
          "Returns\n-------\nUniqueId\n    The derived id.\n\n"
          "Raises\n------\nInvalidArgument\n    The seed is empty or the port is 0.")
      .def(
          "child",
          [](const UniqueId& u, const std::string& ip, uint16_t port, const py::bytes& nonce) {
            const std::string raw = nonce;
            RT_CHECK(raw.size() == 16, InvalidArgument, "UniqueId.child: the nonce must be 16 bytes, got ", raw.size());
            std::array<uint8_t, 16> n;
            std::copy(raw.begin(), raw.end(), n.begin());
            return u.child(ip, port, n);
          },
          py::arg("ip"), py::arg("port"), py::arg("nonce"),
          "The unique id at ip:port whose secret is an HMAC of this one's over the public nonce.\n\n"
          "Parameters\n----------\nip : str\n    The child job's rendezvous address.\nport : int\n    Its port, "
          "1..65535.\nnonce : bytes\n    16 public bytes; the same nonce gives the same child.\n\n"
          "Returns\n-------\nUniqueId\n    The child id.\n\n"
          "Raises\n------\nInvalidArgument\n    The nonce is not 16 bytes or the port is 0.")
      .def_readonly("ip", &UniqueId::ip, "Rank 0's IPv4 address, dotted.")
      .def_readonly("port", &UniqueId::port, "Rank 0's TCP port.")
      .def("__str__", &UniqueId::str)
      .def("__repr__", [](const UniqueId& u) { return "UniqueId('" + u.ip + ":" + std::to_string(u.port) + "')"; })
      .def(
          "take_listener", [](const UniqueId& u) { return take_reserved_listener(u.port); },
          "Hand over the socket create() bound for this id's port, e.g. to pass to rank 0's process.\n\n"
          "Returns\n-------\nint\n    The file descriptor, now the caller's to close; -1 if this process holds "
          "none (or already handed it over).")
      .def("__eq__", [](const UniqueId& a, const UniqueId& b) { return a.str() == b.str(); });
}

}  // namespace ringtree
