// Everything the core module holds, for every module that serves as ringtree's core: the
// package's _core, and the test module's core over the CUDA stand-in.
#include "bindings/bindings.h"

namespace ringtree {

void register_core(pybind11::module_& m) {
  register_errors(m);
  register_types(m);
  register_communicator(m);
  register_fast_method(m);
  register_policies(m);
  register_schedules(m);
  register_kernels(m);
  register_security(m);
  register_cuda(m);
}

}  // namespace ringtree
