// Communicator methods without a Python frame (ringtree._core.FastMethod).
//
// A small call's Python method costs more than its traffic: binding `comm.broadcast(x, root=0)`
// to the method's parameters and building the fast entry's twelve arguments took 0.14 us of a
// 0.64 us broadcast between two ranks. A FastMethod stands in the class for such a method: a
// method descriptor, so `comm.broadcast(...)` calls it with the communicator first and no bound
// method is made, which binds the arguments itself and makes the fast entry's call
// (Communicator._fast) from a recipe the Python layer wrote. Anything the recipe does not cover
// (an async call, a buffer other than a numpy array, a missing or unknown argument) and any call
// the fast entry returns NotImplemented for goes to the Python method, unchanged, with the
// caller's own arguments; nothing runs twice, since NotImplemented means nothing ran.
// Read from the class, a FastMethod is that Python method, so documentation and introspection
// see the method as written.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <structmember.h>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>
#include "bindings/bindings.h"

namespace py = pybind11;

namespace ringtree {

namespace {

constexpr int kFastArgs = 12;           // Communicator._fast's arguments
constexpr int kMaxParams = 16;          // parameters after self a recipe may bind
constexpr int kInput = 1, kOutput = 2;  // the fast arguments that are buffers

struct FastMethod {
  PyObject ob_base;  // PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* func;           // the Python method; every call the recipe does not take goes there
  PyObject* names;          // tuple of str: its parameters after self, in order
  PyObject* defaults;       // tuple, one per parameter: its default, or `required` for none
  PyObject* consts;         // tuple of kFastArgs: the constant of each fast argument with no source
  PyObject* owner;          // the class whose slot holds the fast entry
  Py_ssize_t entry_offset;  // that slot's offset in its instances
  int nparams;
  int async_index;         // the parameter that must be False for the fast entry
  int source[kFastArgs];   // the parameter each fast argument is, or -1: consts[i]
  int if_none[kFastArgs];  // where that parameter is None, this parameter instead (-1: none)
};

PyObject* g_required = nullptr;  // the marker of a parameter without a default

// The references a FastMethod holds (its type's aside).
std::array<PyObject**, 5> held(FastMethod* m) { return {&m->func, &m->names, &m->defaults, &m->consts, &m->owner}; }

int param_index(const FastMethod* m, PyObject* name) {
  for (int i = 0; i < m->nparams; ++i)
    if (PyTuple_GET_ITEM(m->names, i) == name) return i;  // keyword names are mostly interned
  for (int i = 0; i < m->nparams; ++i) {
    const int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(m->names, i), name, Py_EQ);
    if (eq < 0) PyErr_Clear();
    if (eq > 0) return i;
  }
  return -1;
}

PyObject* fast_method_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* m = reinterpret_cast<FastMethod*>(callable);
  auto python_method = [&] { return PyObject_Vectorcall(m->func, args, nargsf, kwnames); };
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs < 1 || nargs - 1 > m->nparams) return python_method();
  // Which parameters were given: a mask, not a zeroed array (clearing one cost a sixth of this).
  PyObject* values[kMaxParams];
  uint32_t given = 0;
  for (Py_ssize_t i = 1; i < nargs; ++i) {
    values[i - 1] = args[i];
    given |= 1u << (i - 1);
  }
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    const int i = param_index(m, PyTuple_GET_ITEM(kwnames, k));
    if (i < 0 || (given >> i & 1)) return python_method();  // its TypeError, worded as Python words it
    values[i] = args[nargs + k];
    given |= 1u << i;
  }
  for (int i = 0; i < m->nparams; ++i) {
    if (given >> i & 1) continue;
    values[i] = PyTuple_GET_ITEM(m->defaults, i);
    if (values[i] == g_required) return python_method();
  }
  if (values[m->async_index] != Py_False) return python_method();
  PyObject* fast_args[kFastArgs];
  for (int j = 0; j < kFastArgs; ++j) {
    PyObject* v = m->source[j] >= 0 ? values[m->source[j]] : PyTuple_GET_ITEM(m->consts, j);
    if (v == Py_None && m->if_none[j] >= 0) v = values[m->if_none[j]];
    fast_args[j] = v;
  }
  // Torch tensors and other buffers: the Python method reads them once, without a wasted try here.
  for (int j : {kInput, kOutput})
    if (fast_args[j] != Py_None && !is_ndarray(fast_args[j])) return python_method();
  // Read per call: a group swaps in its own entry.
  if (!PyObject_TypeCheck(args[0], reinterpret_cast<PyTypeObject*>(m->owner))) return python_method();
  PyObject* fast = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(args[0]) + m->entry_offset);
  if (!fast) return python_method();
  Py_INCREF(fast);  // the call may swap the slot's entry
  PyObject* done = call_fast_entry(fast, fast_args, kFastArgs);
  Py_DECREF(fast);
  if (done != Py_NotImplemented) return done;  // the result, or the call's error
  Py_DECREF(done);
  return python_method();
}

PyObject* fast_method_get(PyObject* self, PyObject* obj, PyObject*) {
  auto* m = reinterpret_cast<FastMethod*>(self);
  if (obj == nullptr || obj == Py_None) return Py_NewRef(m->func);
  return PyMethod_New(self, obj);
}

PyObject* forward_attr(PyObject* self, void* name) {
  return PyObject_GetAttrString(reinterpret_cast<FastMethod*>(self)->func, static_cast<const char*>(name));
}

PyObject* wrapped_of(PyObject* self, void*) { return Py_NewRef(reinterpret_cast<FastMethod*>(self)->func); }

int fast_method_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  for (PyObject** ref : held(reinterpret_cast<FastMethod*>(self))) Py_VISIT(*ref);
  return 0;
}

int fast_method_clear(PyObject* self) {
  for (PyObject** ref : held(reinterpret_cast<FastMethod*>(self))) Py_CLEAR(*ref);
  return 0;
}

void fast_method_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  fast_method_clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* fast_method_repr(PyObject* self) {
  return PyUnicode_FromFormat("<fast method %R>", reinterpret_cast<FastMethod*>(self)->func);
}

PyGetSetDef g_fast_method_getset[] = {
    {"__doc__", forward_attr, nullptr, nullptr, const_cast<char*>("__doc__")},
    {"__name__", forward_attr, nullptr, nullptr, const_cast<char*>("__name__")},
    {"__qualname__", forward_attr, nullptr, nullptr, const_cast<char*>("__qualname__")},
    {"__wrapped__", wrapped_of, nullptr, const_cast<char*>("The Python method this stands for."), nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMemberDef g_fast_method_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(FastMethod, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot g_fast_method_slots[] = {
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_descr_get, reinterpret_cast<void*>(fast_method_get)},
    {Py_tp_traverse, reinterpret_cast<void*>(fast_method_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(fast_method_clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(fast_method_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(fast_method_repr)},
    {Py_tp_getset, g_fast_method_getset},
    {Py_tp_members, g_fast_method_members},
    {0, nullptr},
};

PyType_Spec g_fast_method_spec = {
    "ringtree._core.FastMethod",
    sizeof(FastMethod),
    0,
    // Immutable, or the interpreter never specializes its method loads; made only by fast_method().
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR |
        Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    g_fast_method_slots,
};

PyTypeObject* g_fast_method_type = nullptr;

}  // namespace

void register_fast_method(py::module_& m) {
  g_required = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  g_fast_method_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_fast_method_spec));
  if (!g_required || !g_fast_method_type) throw py::error_already_set();
  m.attr("FAST_METHOD_REQUIRED") = py::reinterpret_borrow<py::object>(g_required);
  m.def(
      "fast_method",
      [](py::object func, py::type owner, py::object entry_slot, py::tuple names, py::tuple defaults, int async_index,
         std::vector<int> source, std::vector<int> if_none, py::tuple consts) {
        RT_CHECK(Py_IS_TYPE(entry_slot.ptr(), &PyMemberDescr_Type), InvalidArgument,
                 "fast_method: entry_slot must be a __slots__ member");
        const PyMemberDef* slot = reinterpret_cast<PyMemberDescrObject*>(entry_slot.ptr())->d_member;
        RT_CHECK(slot->type == T_OBJECT_EX &&
                     PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(owner.ptr()),
                                      reinterpret_cast<PyMemberDescrObject*>(entry_slot.ptr())->d_common.d_type),
                 InvalidArgument, "fast_method: entry_slot must be a __slots__ member of owner");
        const int n = static_cast<int>(names.size());
        RT_CHECK(n <= kMaxParams && defaults.size() == names.size(), InvalidArgument, "fast_method: at most ",
                 kMaxParams, " parameters, one default each");
        RT_CHECK(source.size() == kFastArgs && if_none.size() == kFastArgs && consts.size() == kFastArgs,
                 InvalidArgument, "fast_method: ", kFastArgs, " sources, fallbacks and constants");
        auto in_range = [n](int i) { return i >= -1 && i < n; };
        RT_CHECK(async_index >= 0 && async_index < n, InvalidArgument, "fast_method: async_index out of range");
        for (int j = 0; j < kFastArgs; ++j)
          RT_CHECK(in_range(source[j]) && in_range(if_none[j]), InvalidArgument, "fast_method: a source out of range");
        auto* fm = PyObject_GC_New(FastMethod, g_fast_method_type);
        if (!fm) throw py::error_already_set();
        fm->vectorcall = fast_method_call;
        fm->func = func.release().ptr();
        fm->names = names.release().ptr();
        fm->defaults = defaults.release().ptr();
        fm->consts = consts.release().ptr();
        fm->owner = owner.release().ptr();
        fm->entry_offset = slot->offset;
        fm->nparams = n;
        fm->async_index = async_index;
        for (int j = 0; j < kFastArgs; ++j) {
          fm->source[j] = source[j];
          fm->if_none[j] = if_none[j];
        }
        PyObject_GC_Track(fm);
        return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(fm));
      },
      py::arg("func"), py::arg("owner"), py::arg("entry_slot"), py::arg("names"), py::arg("defaults"),
      py::arg("async_index"), py::arg("source"), py::arg("if_none"), py::arg("consts"),
      "A method descriptor that calls Communicator._fast from a recipe, and `func` for anything else.");
}

}  // namespace ringtree
