// C++ exception classes map class-for-class onto Python classes. Each also derives from the
// closest built-in, so `except TimeoutError` or `except ValueError` work as users expect.
#include <pybind11/pybind11.h>
#include "bindings/bindings.h"
#include "ringtree/errors.h"

namespace py = pybind11;

namespace ringtree {

namespace {

PyObject* make_class(py::module_& m, const char* name, std::initializer_list<PyObject*> bases, const char* doc) {
  py::tuple t(bases.size());
  size_t i = 0;
  for (PyObject* b : bases) t[i++] = py::reinterpret_borrow<py::object>(b);
  std::string qualified = std::string("ringtree.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, t.ptr(), nullptr);
  if (!cls) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

PyObject *py_error, *py_invalid, *py_timeout, *py_peer, *py_mismatch, *py_aborted, *py_bootstrap;

}  // namespace

void register_errors(py::module_& m) {
  py_error = make_class(m, "Error", {PyExc_RuntimeError}, "Base class of every ringtree error.");
  py_invalid = make_class(m, "InvalidArgument", {py_error, PyExc_ValueError},
                          "A bad argument, raised before any traffic; the communicator stays usable.");
  py_timeout = make_class(m, "Timeout", {py_error, PyExc_TimeoutError}, "A collective or wait did not complete in time.");
  py_peer = make_class(m, "PeerFailure", {py_error, PyExc_ConnectionError}, "A peer died or its connection broke.");
  py_mismatch = make_class(m, "CollectiveMismatch", {py_error},
                           "Ranks called different collectives, or the same one with different arguments.");
  py_aborted = make_class(m, "Aborted", {py_error}, "The communicator was aborted by an earlier error or closed.");
  py_bootstrap = make_class(m, "BootstrapError", {py_error}, "Setting up the job failed.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) { PyErr_SetString(py_invalid, e.what());
    } catch (const Timeout& e) { PyErr_SetString(py_timeout, e.what());
    } catch (const PeerFailure& e) { PyErr_SetString(py_peer, e.what());
    } catch (const CollectiveMismatch& e) { PyErr_SetString(py_mismatch, e.what());
    } catch (const Aborted& e) { PyErr_SetString(py_aborted, e.what());
    } catch (const BootstrapError& e) { PyErr_SetString(py_bootstrap, e.what());
    } catch (const Error& e) { PyErr_SetString(py_error, e.what());
    }
  });
}

}  // namespace ringtree
