// C++ errors map kind-for-class onto Python classes. Each also derives from the
// closest built-in, so `except TimeoutError` or `except ValueError` work as users expect.
#include <pybind11/pybind11.h>
#include "bindings/bindings.h"
#include "ringtree/errors.h"

namespace py = pybind11;

namespace ringtree {

namespace {

PyObject* make_class(py::module_& m, const char* name, std::initializer_list<PyObject*> bases, const char* doc,
                     ErrorKind kind) {
  py::tuple t(bases.size());
  size_t i = 0;
  for (PyObject* b : bases) t[i++] = py::reinterpret_borrow<py::object>(b);
  std::string qualified = std::string("ringtree.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, t.ptr(), nullptr);
  if (!cls) throw py::error_already_set();
  py::object obj = py::reinterpret_borrow<py::object>(cls);
  obj.attr("kind") = error_kind_name(kind);  // err.kind names the class, one to one
  m.add_object(name, obj);
  return cls;
}

// The Python class of each ErrorKind, by code.
PyObject* py_class_of[static_cast<int>(ErrorKind::Count)] = {};

}  // namespace

void register_errors(py::module_& m) {
  auto add = [&](const char* name, std::initializer_list<PyObject*> bases, const char* doc, ErrorKind kind) {
    return py_class_of[static_cast<int>(kind)] = make_class(m, name, bases, doc, kind);
  };
  PyObject* error = add("Error", {PyExc_RuntimeError}, "Base class of every ringtree error; err.kind names its class.",
                        ErrorKind::Error);
  add("InvalidArgument", {error, PyExc_ValueError},
      "A bad argument, raised before any traffic; the communicator stays usable.", ErrorKind::InvalidArgument);
  add("Timeout", {error, PyExc_TimeoutError}, "A collective or wait did not complete in time.", ErrorKind::Timeout);
  add("PeerFailure", {error, PyExc_ConnectionError}, "A peer died or its connection broke.", ErrorKind::PeerFailure);
  add("CollectiveMismatch", {error}, "Ranks called different collectives, or the same one with different arguments.",
      ErrorKind::CollectiveMismatch);
  add("Aborted", {error}, "The communicator was aborted by an earlier error or closed.", ErrorKind::Aborted);
  add("BootstrapError", {error}, "Setting up the job failed.", ErrorKind::Bootstrap);
  // Local to the module that registers it: another module built from these sources (the test
  // module) maps its own errors, never this one's.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      const int k = static_cast<int>(e.kind());
      PyErr_SetString(py_class_of[k < static_cast<int>(ErrorKind::Count) ? k : 0], e.what());
    }
  });
}

}  // namespace ringtree
