// What the host kernels tell about themselves: the instruction set the half-precision kernels
// chose for this process.
#include "bindings/bindings.h"
#include "kernels/host/reduce.h"

namespace py = pybind11;

namespace ringtree {

void register_kernels(py::module_& m) {
  m.def("_kernel_isa", &kernel_isa_name,
        "The instruction set the half-precision kernels use: 'avx2+f16c' or 'scalar'.");
}

}  // namespace ringtree
