// The one module entry: ringtree._core. The public Python API is python/ringtree/.
#include "bindings/bindings.h"

namespace ringtree {
// The CUDA path (register_cuda.cc); present in every build, a stub without CUDA.
void register_cuda(pybind11::module_& m);
}  // namespace ringtree

PYBIND11_MODULE(_core, m) {
  m.doc() = "ringtree C++ core: communicators, schedules and host kernels";
  ringtree::register_errors(m);
  ringtree::register_types(m);
  ringtree::register_communicator(m);
  ringtree::register_schedules(m);
  ringtree::register_kernels(m);
  ringtree::register_cuda(m);
}
