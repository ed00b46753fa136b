// _ringtree_testing: the private module the tests load, never the package (`import ringtree`
// does not load it, and a build without it, RINGTREE_TESTING=OFF, is a complete ringtree).
//
// It holds, at its top level, what tests call directly: the host kernels at raw addresses, the
// step walker for every rank in one process (host policy or the real walk kernel), the thread
// ranks and the device kernels over the CUDA stand-in, and hooks into the stand-in itself
// (device memory, streams, contexts, violations). These register no Python classes, so the
// module can be loaded next to ringtree._core. It also exports a fake NCCL (fake_nccl.cc).
//
// core() builds, once, a second ringtree core over the CUDA stand-in: every class and function
// of ringtree._core, with the device path's host code and its kernels running on the CPU
// (kernels/cuda/standin). A rank process that is to run the device path without a GPU installs
// it as ringtree._core before it imports ringtree (tests/support/standin.py).
#include <pybind11/stl.h>
#include "bindings/bindings.h"
#include "bindings/testing/testing.h"
#include "common/check.h"

namespace py = pybind11;

namespace ringtree {
int fake_nccl_aborts();  // fake_nccl.cc
}  // namespace ringtree

PYBIND11_MODULE(_ringtree_testing, m) {
  m.doc() = "ringtree's test hooks and its core over a CPU stand-in of CUDA (tests only)";
  ringtree::register_errors(m);  // the hooks raise these (testing.Error, ...)
  ringtree::register_test_hooks(m);
  ringtree::register_standin_hooks(m);
  ringtree::register_bench_hooks(m);
  ringtree::register_thread_ranks(m);
  m.def("fake_nccl_aborts", &ringtree::fake_nccl_aborts,
        "How often the fake NCCL this module exports (RINGTREE_NCCL_LIBRARY=<this file>) was aborted.");
  m.def(
      "core",
      [m]() {
        py::module_ self = m;
        if (py::hasattr(self, "_core_module")) return py::module_(self.attr("_core_module"));
        py::dict modules = py::module_::import("sys").attr("modules");
        RT_CHECK(!modules.contains("ringtree._core"), Error,
                 "ringtree._core is already loaded in this process: the stand-in core must be installed before ",
                 "ringtree is imported (its classes would clash with the real core's)");
        py::module_ core = self.def_submodule("core", "ringtree's core over the CUDA stand-in");
        ringtree::register_core(core);
        core.attr("CUDA_STANDIN") = true;
        // From now on every error of this module is raised as the core's classes (ringtree's in
        // this process): the top level names them too.
        for (const char* name :
             {"Error", "InvalidArgument", "Timeout", "PeerFailure", "CollectiveMismatch", "Aborted", "BootstrapError"})
          self.attr(name) = core.attr(name);
        self.attr("_core_module") = core;
        return core;
      },
      "ringtree's core over the CUDA stand-in (built at the first call): install it as ringtree._core\n"
      "before importing ringtree. Refused once ringtree._core is loaded.");
}
