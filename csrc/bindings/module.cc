// The module entry of the package: ringtree._core. The public Python API is python/ringtree/.
#include "bindings/bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "ringtree C++ core: communicators, schedules and host kernels";
  ringtree::register_core(m);
}
