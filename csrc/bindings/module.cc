// The one module entry: ringtree._core. The public Python API is python/ringtree/. The same
// entry, built over the CPU stand-in of the CUDA runtime, is ringtree._core_standin (tests).
#include "bindings/bindings.h"

#ifndef RINGTREE_MODULE_NAME
#define RINGTREE_MODULE_NAME _core
#endif

namespace ringtree {
// The CUDA path (register_cuda.cc); present in every build, a stub without CUDA.
void register_cuda(pybind11::module_& m);
#ifdef RINGTREE_CUDA_STANDIN
void register_cuda_standin(pybind11::module_& m);
#endif
}  // namespace ringtree

PYBIND11_MODULE(RINGTREE_MODULE_NAME, m) {
  m.doc() = "ringtree C++ core: communicators, schedules and host kernels";
  ringtree::register_errors(m);
  ringtree::register_types(m);
  ringtree::register_communicator(m);
  ringtree::register_policies(m);
  ringtree::register_schedules(m);
  ringtree::register_kernels(m);
  ringtree::register_security(m);
  ringtree::register_cuda(m);
#ifdef RINGTREE_CUDA_STANDIN
  ringtree::register_cuda_standin(m);
#endif
}
