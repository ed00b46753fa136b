// Communicator and Work. Every call that can block releases the GIL.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
// Built against NumPy 2 headers, targeting the NumPy 1.22 API (the oldest numpy the package
// accepts), so one build runs on either.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>
#include <algorithm>
#include <new>
#include <vector>
#include "bindings/bindings.h"
#include "bindings/choice_hook.h"
#include "exec/plan.h"
#include "runtime/flight_recorder.h"
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

// The hot path reads ndarrays only: their struct gives pointer, size, dtype and flags in a few
// loads. Anything else (torch tensors, bfloat16 from ml_dtypes, strided or byte-swapped arrays,
// other buffer objects) returns false and takes the Python route, which explains problems.
bool open_ndarray(PyObject* obj, Buffer& b, int& dtype) {
  if (!PyArray_Check(obj)) return false;
  auto* arr = reinterpret_cast<PyArrayObject*>(obj);
  if (!PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISNOTSWAPPED(arr)) return false;
  const npy_intp itemsize = PyArray_ITEMSIZE(arr);
  switch (PyArray_DESCR(arr)->kind) {
    case 'i':
      dtype = itemsize == 1   ? static_cast<int>(DataType::Int8)
              : itemsize == 4 ? static_cast<int>(DataType::Int32)
              : itemsize == 8 ? static_cast<int>(DataType::Int64)
                              : -1;
      break;
    case 'u':
      dtype = itemsize == 1 ? static_cast<int>(DataType::Uint8) : -1;
      break;
    case 'f':
      dtype = itemsize == 2   ? static_cast<int>(DataType::Float16)
              : itemsize == 4 ? static_cast<int>(DataType::Float32)
              : itemsize == 8 ? static_cast<int>(DataType::Float64)
                              : -1;
      break;
    default:
      dtype = -1;
  }
  if (dtype < 0 || PyArray_TYPE(arr) >= NPY_USERDEF) return false;
  b.present = true;
  b.ptr = PyArray_DATA(arr);
  const int ndim = PyArray_NDIM(arr);  // PyArray_SIZE is an out-of-line call; most are 1-d
  b.count = ndim == 1   ? static_cast<uint64_t>(PyArray_DIM(arr, 0))
            : ndim == 0 ? 1
                        : static_cast<uint64_t>(PyArray_SIZE(arr));
  b.readonly = !PyArray_ISWRITEABLE(arr);
  return true;
}

// The arguments both entry points take as codes and numbers; buffers are filled in by each.
CollectiveArgs make_args(int coll, int op, double factor, int root, int peer, int algo, double timeout) {
  CollectiveArgs a;
  a.coll = checked_enum(coll, Collective::Count, "collective");
  a.op = checked_enum(op, ReduceOp::Count, "reduce op");
  a.premul_factor = factor;
  a.root = root;
  a.peer = peer;
  a.algo = checked_enum(algo, Algo::Count, "algo");
  a.timeout_s = timeout;
  return a;
}

void fill_args(CollectiveArgs& a, int dtype, Buffer in, Buffer out, std::vector<uint64_t> send_counts,
               std::vector<uint64_t> recv_counts, int recv_peer, bool deterministic) {
  a.deterministic = deterministic;
  a.dtype = checked_enum(dtype, DataType::Count, "dtype");
  a.input = in;
  a.output = out;
  a.send_counts = std::move(send_counts);
  a.recv_counts = std::move(recv_counts);
  a.recv_peer = recv_peer;
}

// A persistent request's blocking start as one CPython call without arguments (the per-call
// floor is what persistent calls are for): bound to the request through a capsule.
constexpr const char* kStartCapsule = "ringtree.request_start";

PyObject* start_call(PyObject* self, PyObject*) {
  auto* req = static_cast<std::shared_ptr<Request>*>(PyCapsule_GetPointer(self, kStartCapsule));
  if (!req) return nullptr;
  try {
    py::gil_scoped_release release;
    (*req)->start(false);
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef g_start_def = {"start", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&start_call)),
                           METH_NOARGS, "Runs the request once, blocking (Request.start(False))."};

// The collectives' entry from Python, one CPython call with no pybind11 dispatch:
// fast(coll, x, out, op, root, peer, algo, timeout, deterministic, async_op, result, recv_peer)
// runs the call and returns `result` (blocking) or its Work (async), or returns NotImplemented
// for anything the Python route must convert or explain: buffers other than plain ndarrays or
// (pointer, count, dtype code) tuples the Python layer made from torch CPU tensors, an op or
// algo that is not a known name, a timeout that is not a positive number, a flag that is not a
// bool. Bound to one communicator through a capsule, so no argument names it. Per call this
// parses twelve positional arguments with a few type checks and two dict lookups: the Python
// layer's frames and pybind11's argument loaders cost more than a small collective's traffic.
// A group's entry (made at group start) also holds the group's keep list and appends each
// collected call's buffers to it, so a call inside a group is the same one C call; the plain
// entry returns NotImplemented inside a group, leaving the buffers to the Python route.
constexpr const char* kFastCapsule = "ringtree.fast_call";
struct FastEntry {
  std::shared_ptr<Communicator> comm;
  PyObject* group_keep = nullptr;  // owned; a list, for a group's entry
  ~FastEntry() { Py_XDECREF(group_keep); }
};
PyObject* g_op_codes = nullptr;    // {"sum": 0, ...} without premul_sum (it needs a factor)
PyObject* g_algo_codes = nullptr;  // {"auto": 0, ...}

bool small_int(PyObject* o, int& v) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long x = PyLong_AsLongAndOverflow(o, &overflow);
  if (overflow || x < INT32_MIN || x > INT32_MAX) return false;
  v = static_cast<int>(x);
  return true;
}

// The defaults ("sum", "auto") as interned strings: the Python layer passes its literals, which
// are these very objects, so most calls find their code by one comparison, not a dict lookup.
PyObject* g_sum_name = nullptr;
PyObject* g_auto_name = nullptr;

// `zero_name`: the table's name of code 0.
bool code_of(PyObject* table, PyObject* zero_name, PyObject* name, int& code) {
  if (name == zero_name) {
    code = 0;
    return true;
  }
  if (!PyUnicode_CheckExact(name)) return false;
  PyObject* value = PyDict_GetItemWithError(table, name);  // borrowed
  if (!value) {
    PyErr_Clear();
    return false;
  }
  return small_int(value, code);
}

// A buffer the Python layer has already read (torch CPU tensors): a (tag, pointer, count, dtype
// code) tuple whose first item is this module's HOST_VIEW_TAG. The tag keeps a tuple the user
// passed as a buffer from being taken for an address: it goes to the Python route, which
// converts or refuses it.
PyObject* g_host_view_tag = nullptr;

bool open_raw(PyObject* obj, Buffer& b, int& dtype) {
  if (!PyTuple_CheckExact(obj) || PyTuple_GET_SIZE(obj) != 4 || PyTuple_GET_ITEM(obj, 0) != g_host_view_tag)
    return false;
  const unsigned long long ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(obj, 1));
  const unsigned long long count = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(obj, 2));
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (!small_int(PyTuple_GET_ITEM(obj, 3), dtype) || dtype < 0 || dtype >= static_cast<int>(DataType::Count))
    return false;
  b.present = true;
  b.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
  b.count = count;
  b.readonly = false;
  return true;
}

bool open_buffer(PyObject* obj, Buffer& b, int& dtype) {
  return open_ndarray(obj, b, dtype) || open_raw(obj, b, dtype);
}

// None: the communicator's default (-1); a positive int or float: seconds; else false.
bool timeout_of(PyObject* t, double& seconds) {
  if (t == Py_None) {
    seconds = -1.0;
    return true;
  }
  if (PyFloat_CheckExact(t))
    seconds = PyFloat_AS_DOUBLE(t);
  else if (PyLong_CheckExact(t))
    seconds = PyLong_AsDouble(t);
  else
    return false;
  if (PyErr_Occurred()) {  // an int too large for a double: the Python route explains
    PyErr_Clear();
    return false;
  }
  return seconds > 0;
}

bool flag_of(PyObject* o, bool& v) {
  v = o == Py_True;
  return o == Py_True || o == Py_False;
}

PyObject* fast_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 12) {
    PyErr_SetString(PyExc_TypeError,
                    "fast(coll, x, out, op, root, peer, algo, timeout, deterministic, async_op, result, recv_peer)");
    return nullptr;
  }
  auto* entry = static_cast<FastEntry*>(PyCapsule_GetPointer(self, kFastCapsule));
  if (!entry) return nullptr;
  Communicator& comm = *entry->comm;
  int coll = 0, op = 0, root = 0, peer = 0, algo = 0, recv_peer = -1;
  double timeout = -1.0;
  bool deterministic = false, async_op = false;
  if (!small_int(args[0], coll) || !code_of(g_op_codes, g_sum_name, args[3], op) || !small_int(args[4], root) ||
      !small_int(args[5], peer) || !code_of(g_algo_codes, g_auto_name, args[6], algo) ||
      !timeout_of(args[7], timeout) || !flag_of(args[8], deterministic) || !flag_of(args[9], async_op) ||
      !small_int(args[11], recv_peer))
    return Py_NewRef(Py_NotImplemented);
  try {
    CollectiveArgs a = make_args(coll, op, 1.0, root, peer, algo, timeout);
    a.deterministic = deterministic;
    a.recv_peer = recv_peer;
    int in_dtype = -1, out_dtype = -1;
    if ((args[1] != Py_None && !open_buffer(args[1], a.input, in_dtype)) ||
        (args[2] != Py_None && !open_buffer(args[2], a.output, out_dtype)) ||
        (in_dtype >= 0 && out_dtype >= 0 && in_dtype != out_dtype))
      return Py_NewRef(Py_NotImplemented);
    a.dtype = static_cast<DataType>(std::max({in_dtype, out_dtype, 0}));
    std::shared_ptr<Work> work;
    if (comm.in_group()) {
      if (!entry->group_keep) return Py_NewRef(Py_NotImplemented);
      work = comm.run(a, async_op);  // only collected: nothing blocks, so the GIL stays
      // Held until the group has run; after run(), so a refused call leaves nothing behind.
      for (PyObject* buffer : {args[1], args[2]})
        if (buffer != Py_None && PyList_Append(entry->group_keep, buffer) < 0) return nullptr;
    } else {
      py::gil_scoped_release release;
      work = comm.run(a, async_op);
    }
    if (work) return py::cast(std::move(work)).release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();  // sets the Python error from the C++ one
    return nullptr;
  }
  return Py_NewRef(args[10]);
}

PyMethodDef g_fast_call_def = {"fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_call)),
                               METH_FASTCALL,
                               "A collective on plain ndarrays or read torch tensors (see Communicator._fast)."};

bool is_sequence(PyObject* o) { return PyList_CheckExact(o) || PyTuple_CheckExact(o); }

// A list of calls of one collective as one group, in one CPython call (the *_coalesced methods),
// on plain ndarrays only (torch tensors take the Python route, call by call):
// many(coll, xs, outs, op, algo, timeout, deterministic, async_op, result) runs call i on xs[i]
// and outs[i] (outs None: in place) and returns `result` (blocking), (the group's Work, the
// buffers it must keep) (async), or NotImplemented, before anything is collected, where a buffer
// or argument needs the Python route, or a group is already open (the Python route keeps the
// buffers of an enclosing group).
// Issuing the calls one by one from Python costs a frame and a C call each, several times what
// the fused group costs to run.
PyObject* fast_many(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "many(coll, xs, outs, op, algo, timeout, deterministic, async_op, result)");
    return nullptr;
  }
  auto* entry = static_cast<FastEntry*>(PyCapsule_GetPointer(self, kFastCapsule));
  if (!entry) return nullptr;
  Communicator& comm = *entry->comm;
  PyObject *xs = args[1], *outs = args[2];
  int coll = 0, op = 0, algo = 0;
  double timeout = -1.0;
  bool deterministic = false, async_op = false;
  if (!small_int(args[0], coll) || !is_sequence(xs) || (outs != Py_None && !is_sequence(outs)) ||
      !code_of(g_op_codes, g_sum_name, args[3], op) || !code_of(g_algo_codes, g_auto_name, args[4], algo) ||
      !timeout_of(args[5], timeout) || !flag_of(args[6], deterministic) || !flag_of(args[7], async_op) ||
      comm.in_group())
    return Py_NewRef(Py_NotImplemented);
  const Py_ssize_t n = Py_SIZE(xs);
  if (outs != Py_None && Py_SIZE(outs) != n) return Py_NewRef(Py_NotImplemented);  // explained there
  // Every buffer is read before the group opens, so a fallback leaves nothing half collected.
  // The lists alone hold their buffers, and the GIL is let go while the group runs: another
  // thread emptying a list must not free a buffer in use, so each is held here until the end.
  // Both lists are this thread's and keep their capacity: a repeated call allocates nothing. A
  // buffer's finalizer that calls in again (a release at the end can run one) takes the Python
  // route, so the lists are never reused while in use.
  thread_local std::vector<Communicator::CallBuffers> tls_opened;
  thread_local std::vector<PyObject*> tls_held;
  thread_local bool tls_busy = false;
  if (tls_busy) return Py_NewRef(Py_NotImplemented);
  std::vector<Communicator::CallBuffers>& opened = tls_opened;
  struct Held {
    PyObject** objects;
    size_t count = 0;
    bool& busy;
    ~Held() {
      for (size_t i = 0; i < count; ++i) Py_DECREF(objects[i]);
      busy = false;
    }
  };
  try {
    opened.resize(static_cast<size_t>(n));
    tls_held.resize(static_cast<size_t>(outs == Py_None ? n : 2 * n));
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
  tls_busy = true;
  Held held{tls_held.data(), 0, tls_busy};
  PyObject* const* x_items = PySequence_Fast_ITEMS(xs);
  PyObject* const* out_items = outs == Py_None ? nullptr : PySequence_Fast_ITEMS(outs);
  for (Py_ssize_t i = 0; i < n; ++i) {
    Communicator::CallBuffers& o = opened[static_cast<size_t>(i)];
    int in_dtype = -1, out_dtype = -1;
    held.objects[held.count++] = Py_NewRef(x_items[i]);
    if (!open_ndarray(x_items[i], o.input, in_dtype)) return Py_NewRef(Py_NotImplemented);
    if (!out_items) {
      // Field by field: copying the whole Buffer just written costs ~2 ns a call (a list of 64
      // 1.51 against 1.66 us, measured), as the copy reads back stores still in flight.
      o.output.present = true;
      o.output.ptr = o.input.ptr;
      o.output.count = o.input.count;
      o.output.readonly = o.input.readonly;
    } else {
      held.objects[held.count++] = Py_NewRef(out_items[i]);
      if (!open_ndarray(out_items[i], o.output, out_dtype) || out_dtype != in_dtype)
        return Py_NewRef(Py_NotImplemented);
    }
    o.dtype = static_cast<DataType>(in_dtype);
  }
  // An async group outlives this call: its buffers go with its Work, taken before the GIL is let
  // go (a list emptied meanwhile must not drop them).
  py::object keep;
  if (async_op) {
    keep = py::reinterpret_steal<py::object>(PyTuple_New(static_cast<Py_ssize_t>(held.count)));
    if (!keep) return nullptr;
    for (size_t i = 0; i < held.count; ++i)
      PyTuple_SET_ITEM(keep.ptr(), static_cast<Py_ssize_t>(i), Py_NewRef(held.objects[i]));
  }
  try {
    CollectiveArgs a = make_args(coll, op, 1.0, 0, -1, algo, timeout);
    a.deterministic = deterministic;
    std::shared_ptr<Work> work;
    {
      py::gil_scoped_release release;  // the buffers stay: `held` holds them
      work = comm.run_coalesced(a, opened.data(), opened.size(), async_op);
    }
    if (work) return py::make_tuple(py::cast(std::move(work)), keep).release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
  return Py_NewRef(args[8]);
}

PyMethodDef g_fast_many_def = {"many", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_many)),
                               METH_FASTCALL, "A list of one collective's calls as one group (see _coalesced)."};

// A C function of `def` bound to `held` through a capsule named `name`, which owns it.
template <typename T>
py::object bound_function(PyMethodDef* def, const char* name, T* held) {
  PyObject* capsule = PyCapsule_New(
      held, name, [](PyObject* cap) { delete static_cast<T*>(PyCapsule_GetPointer(cap, PyCapsule_GetName(cap))); });
  if (!capsule) {
    delete held;
    throw py::error_already_set();
  }
  PyObject* fn = PyCFunction_NewEx(def, capsule, nullptr);
  Py_DECREF(capsule);
  if (!fn) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

py::object code_table(const std::vector<std::pair<std::string, int>>& names) {
  py::dict d;
  for (const auto& [name, code] : names) d[py::str(name)] = code;
  return d;
}

}  // namespace

bool is_ndarray(PyObject* obj) { return PyArray_Check(obj); }

PyObject* call_fast_entry(PyObject* entry, PyObject* const* args, Py_ssize_t nargs) {
  if (PyCFunction_Check(entry) && PyCFunction_GET_FUNCTION(entry) == g_fast_call_def.ml_meth)
    return fast_call(PyCFunction_GET_SELF(entry), args, nargs);  // no call machinery between
  return PyObject_Vectorcall(entry, args, static_cast<size_t>(nargs), nullptr);
}

void register_communicator(py::module_& m) {
  m.def("deterministic_setting", &deterministic_setting, "RINGTREE_DETERMINISTIC=1 in this process (read once).");
  if (_import_array() < 0) throw py::error_already_set();  // NumPy's C API table, for open_ndarray
  {
    std::vector<std::pair<std::string, int>> ops, algos;
    for (int i = 0; i < static_cast<int>(ReduceOp::Count); ++i)
      if (static_cast<ReduceOp>(i) != ReduceOp::PremulSum) ops.emplace_back(op_name(static_cast<ReduceOp>(i)), i);
    for (int i = 0; i < static_cast<int>(Algo::Count); ++i) algos.emplace_back(algo_name(static_cast<Algo>(i)), i);
    g_op_codes = code_table(ops).release().ptr();  // the module's lifetime: never freed
    g_algo_codes = code_table(algos).release().ptr();
    static_assert(static_cast<int>(ReduceOp::Sum) == 0 && static_cast<int>(Algo::Auto) == 0, "code_of's shortcut");
    g_host_view_tag = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
    if (!g_host_view_tag) throw py::error_already_set();
    m.attr("HOST_VIEW_TAG") = py::reinterpret_borrow<py::object>(g_host_view_tag);
    g_sum_name = PyUnicode_InternFromString(op_name(ReduceOp::Sum));
    g_auto_name = PyUnicode_InternFromString(algo_name(Algo::Auto));
    if (!g_sum_name || !g_auto_name) throw py::error_already_set();
  }
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", &Work::wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>())
      .def("is_completed", &Work::is_completed);

  py::class_<MessageWork, std::shared_ptr<MessageWork>>(m, "MessageWork", "One isend or irecv in flight.")
      .def("wait", &MessageWork::wait, py::arg("timeout") = 0.0, py::call_guard<py::gil_scoped_release>(),
           "Waits up to timeout s (<= 0: the communicator's); raises the message's error, or Timeout after cancelling "
           "it.")
      .def("is_completed", &MessageWork::is_completed)
      .def("cancel", &MessageWork::cancel, py::call_guard<py::gil_scoped_release>())
      .def(
          "status",
          [](const MessageWork& w) {
            const MessageStatus s = w.status();
            return py::make_tuple(s.source, s.tag, s.bytes);
          },
          "(source, tag, bytes)");

  py::class_<Gate, std::shared_ptr<Gate>>(m, "Gate",
                                          "Holds back a call's traffic until open(): see Communicator.run(gate=).")
      .def(py::init([](std::function<void()> on_done) { return std::make_shared<Gate>(std::move(on_done)); }),
           py::arg("on_done") = nullptr)
      .def("open", &Gate::open)
      .def("fail", &Gate::fail, py::arg("why"));

  py::class_<Request, std::shared_ptr<Request>>(m, "Request",
                                                "A persistent call or group: start() runs it again (Communicator.h).")
      .def("start", &Request::start, py::arg("async_op") = false, py::call_guard<py::gil_scoped_release>(),
           "Blocking: runs it and returns None; async_op=True: a Work at once.")
      .def(
          "start_function",
          [](std::shared_ptr<Request> r) {
            return bound_function(&g_start_def, kStartCapsule, new std::shared_ptr<Request>(std::move(r)));
          },
          "A function of no arguments that runs the request blocking.");

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
             std::vector<uint64_t> recv_counts, int recv_peer, std::shared_ptr<Gate> gate, bool deterministic) {
            CollectiveArgs a = make_args(coll, op, factor, root, peer, algo, timeout);
            fill_args(a, dtype, make_buffer(has_in, in_ptr, in_count, in_ro),
                      make_buffer(has_out, out_ptr, out_count, out_ro), std::move(send_counts), std::move(recv_counts),
                      recv_peer, deterministic);
            a.ready = std::move(gate);
            return c.run(a, async_op);
          },
          py::arg("coll"), py::arg("dtype"), py::arg("has_in"), py::arg("in_ptr"), py::arg("in_count"),
          py::arg("in_ro"), py::arg("has_out"), py::arg("out_ptr"), py::arg("out_count"), py::arg("out_ro"),
          py::arg("op"), py::arg("factor"), py::arg("root"), py::arg("peer"), py::arg("algo"), py::arg("timeout"),
          py::arg("async_op"), py::arg("send_counts") = std::vector<uint64_t>{},
          py::arg("recv_counts") = std::vector<uint64_t>{}, py::arg("recv_peer") = -1,
          py::arg("gate") = std::shared_ptr<Gate>(), py::arg("deterministic") = false,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "persistent",
          [](Communicator& c, int coll, int dtype, bool has_in, uintptr_t in_ptr, uint64_t in_count, bool in_ro,
             bool has_out, uintptr_t out_ptr, uint64_t out_count, bool out_ro, int op, double factor, int root,
             int peer, int algo, double timeout, int recv_peer, bool deterministic, std::vector<uint64_t> send_counts,
             std::vector<uint64_t> recv_counts) {
            CollectiveArgs a = make_args(coll, op, factor, root, peer, algo, timeout);
            fill_args(a, dtype, make_buffer(has_in, in_ptr, in_count, in_ro),
                      make_buffer(has_out, out_ptr, out_count, out_ro), std::move(send_counts), std::move(recv_counts),
                      recv_peer, deterministic);
            return c.persistent(a);
          },
          py::arg("coll"), py::arg("dtype"), py::arg("has_in"), py::arg("in_ptr"), py::arg("in_count"),
          py::arg("in_ro"), py::arg("has_out"), py::arg("out_ptr"), py::arg("out_count"), py::arg("out_ro"),
          py::arg("op"), py::arg("factor"), py::arg("root"), py::arg("peer"), py::arg("algo"), py::arg("timeout"),
          py::arg("recv_peer") = -1, py::arg("deterministic") = false, py::arg("send_counts") = std::vector<uint64_t>{},
          py::arg("recv_counts") = std::vector<uint64_t>{}, py::call_guard<py::gil_scoped_release>(),
          "Validates and plans the call once: a Request that runs it.")
      .def("group_start", &Communicator::group_start)
      .def("group_end", &Communicator::group_end, py::arg("async_op") = false, py::call_guard<py::gil_scoped_release>(),
           "Runs the group's calls as one operation.")
      .def("group_end_persistent", &Communicator::group_end_persistent, py::call_guard<py::gil_scoped_release>(),
           "Ends the group without running it: a Request that runs it.")
      .def("group_discard", &Communicator::group_discard, "Drops the group's calls; nothing was sent.")
      .def_property_readonly("in_group", &Communicator::in_group)
      .def(
          "fast_call_function",
          [](std::shared_ptr<Communicator> c, py::object group_keep) {
            RT_CHECK(group_keep.is_none() || PyList_CheckExact(group_keep.ptr()), InvalidArgument,
                     "fast_call_function: group_keep must be a list or None");
            return bound_function(
                &g_fast_call_def, kFastCapsule,
                new FastEntry{std::move(c), group_keep.is_none() ? nullptr : group_keep.release().ptr()});
          },
          py::arg("group_keep") = py::none(),
          "This communicator's fast entry for collectives (Communicator._fast); with a list, a "
          "group's entry, which appends each collected call's buffers to it.")
      .def(
          "fast_many_function",
          [](std::shared_ptr<Communicator> c) {
            return bound_function(&g_fast_many_def, kFastCapsule, new FastEntry{std::move(c), nullptr});
          },
          "This communicator's entry for a list of calls as one group (Communicator._fast_many).")
      .def(
          "choose_algo",
          [](Communicator& c, int coll, int algo, uint64_t bytes, int dtype, int op, bool deterministic) {
            return static_cast<int>(c.choose_algo(
                checked_enum(coll, Collective::Count, "collective"), checked_enum(algo, Algo::Count, "algo"), bytes,
                checked_enum(dtype, DataType::Count, "dtype"), checked_enum(op, ReduceOp::Count, "reduce op"),
                deterministic || deterministic_setting()));
          },
          py::arg("coll"), py::arg("algo"), py::arg("bytes"), py::arg("dtype") = static_cast<int>(DataType::Float32),
          py::arg("op") = 0, py::arg("deterministic") = false)
      .def(
          "estimate",
          [](Communicator& c, int coll, uint64_t bytes, int dtype, bool deterministic) {
            return estimate_tuples(c.estimate(checked_enum(coll, Collective::Count, "collective"), bytes,
                                              checked_enum(dtype, DataType::Count, "dtype"), deterministic));
          },
          py::arg("coll"), py::arg("bytes"), py::arg("dtype") = static_cast<int>(DataType::Float32),
          py::arg("deterministic") = false)
      .def(
          "isend",
          [](Communicator& c, uintptr_t ptr, uint64_t bytes, int dst, int64_t tag) {
            return c.isend(reinterpret_cast<const void*>(ptr), bytes, dst, tag);
          },
          py::arg("ptr"), py::arg("nbytes"), py::arg("dst"), py::arg("tag"), py::call_guard<py::gil_scoped_release>())
      .def(
          "irecv",
          [](Communicator& c, uintptr_t ptr, uint64_t capacity, bool readonly, int src, int64_t tag) {
            return c.irecv(reinterpret_cast<void*>(ptr), capacity, readonly, src, tag);
          },
          py::arg("ptr"), py::arg("capacity"), py::arg("readonly"), py::arg("src"), py::arg("tag"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "probe",
          [](Communicator& c, int src, int64_t tag, double timeout) {
            MessageStatus s;
            {
              py::gil_scoped_release release;
              s = c.probe(src, tag, timeout);
            }
            return py::make_tuple(s.source, s.tag, s.bytes);
          },
          py::arg("src"), py::arg("tag"), py::arg("timeout") = 0.0)
      .def(
          "iprobe",
          [](Communicator& c, int src, int64_t tag) -> py::object {
            MessageStatus s;
            if (!c.iprobe(src, tag, s)) return py::none();
            return py::make_tuple(s.source, s.tag, s.bytes);
          },
          py::arg("src"), py::arg("tag"))
      .def(
          "status",
          [](const Communicator& c) {
            CommStatus s;
            {
              py::gil_scoped_release release;
              s = c.status();
            }
            py::dict machine;
            machine["source"] = s.cost_source;
            for (const auto& [name, value] : s.machine) machine[py::str(name)] = value;
            machine["hosts"] = s.hosts;
            py::dict d;
            d["transports"] = s.transports;
            d["hosts"] = s.hosts;
            d["wait_policy"] = s.wait_policy;
            d["single_copy"] = s.single_copy;
            d["numa"] = s.numa;
            d["numa_nodes"] = s.numa_nodes;
            d["shm_stores"] = s.shm_stores;
            d["machine"] = machine;
            d["algo_hook"] = s.algo_hook;
            d["shared_cpu_waits"] = s.shared_cpu_waits;
            d["single_copy_messages"] = s.single_copy_messages;
            d["streamed_pieces"] = s.streamed_pieces;
            d["broadcast_asks_root"] = py::make_tuple(s.broadcast_asks_root.first, s.broadcast_asks_root.second);
            return d;
          },
          "What set-up found and the counters since, as a dict (CommStatus).")
      .def(
          "set_choice_hook", [](Communicator& c, py::object fn) { c.set_choice_hook(choice_hook_of(fn)); },
          py::arg("hook"),
          "fn(request tuple) -> algo code replaces auto's last decision; None restores the cost model's.")
      .def("address", &Communicator::address)
      .def("close", &Communicator::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("is_aborted", &Communicator::is_aborted)
      .def("abort", &Communicator::abort, py::arg("why") = "", py::call_guard<py::gil_scoped_release>(),
           "From any thread: every call in flight and every later call raises Aborted, on every rank.")
      .def("dump_json", &Communicator::dump_json, py::arg("reason") = "request",
           py::call_guard<py::gil_scoped_release>(), "This rank's flight record as JSON (runtime/flight_recorder.h).")
      .def_property_readonly("id", &Communicator::id)
      .def(
          "child_unique_id",
          [](const Communicator& c, const std::string& ip, uint16_t port, py::bytes nonce) {
            const std::string raw = nonce;
            RT_CHECK(raw.size() == 16, InvalidArgument, "child_unique_id: the nonce must be 16 bytes, got ",
                     raw.size());
            std::array<uint8_t, 16> n;
            std::copy(raw.begin(), raw.end(), n.begin());
            return c.child_unique_id(ip, port, n);
          },
          py::arg("ip"), py::arg("port"), py::arg("nonce"),
          "The unique id of a communicator of these ranks at ip:port: its secret derives from this one's and the "
          "nonce.")
      .def("set_label", &Communicator::set_label, py::arg("label"))
      .def("set_clock_offset", &Communicator::set_clock_offset, py::arg("offset_ns"), py::arg("error_ns"));
  m.def("now_ns", &FlightRecorder::now_ns, "The steady clock the flight recorder stamps calls with, in ns.");
}

}  // namespace ringtree
