// The communicator's two decisions as units a test drives without ranks: the algorithm choice
// (MachineCosts, AlgoChoice; runtime/algo_choice.h) and the wait policy (exec/host/wait_policy.h).
#include <pybind11/stl.h>
#include <vector>
#include "bindings/bindings.h"
#include "bindings/choice_hook.h"
#include "exec/host/wait_policy.h"
#include "runtime/algo_choice.h"

namespace py = pybind11;

namespace ringtree {

void register_policies(py::module_& m) {
  py::class_<MachineCosts>(m, "MachineCosts",
                           "The cost model's figures (algorithms/pricing.h), in seconds and bytes per second; "
                           "a default one holds the model's defaults.")
      .def(py::init<>())
      .def_readwrite("call_s", &MachineCosts::call_s)
      .def_readwrite("hop_s", &MachineCosts::hop_s)
      .def_readwrite("switch_s", &MachineCosts::switch_s)
      .def_readwrite("tcp_hop_s", &MachineCosts::tcp_hop_s)
      .def_readwrite("tcp_Bps", &MachineCosts::tcp_Bps)
      .def_readwrite("copy_hot_Bps", &MachineCosts::copy_hot_Bps)
      .def_readwrite("copy_cold_Bps", &MachineCosts::copy_cold_Bps)
      .def_readwrite("reduce_hot_Bps", &MachineCosts::reduce_hot_Bps)
      .def_readwrite("reduce_cold_Bps", &MachineCosts::reduce_cold_Bps)
      .def_readwrite("l2_bytes", &MachineCosts::l2_bytes)
      .def_readwrite("l3_bytes", &MachineCosts::l3_bytes)
      .def_readwrite("cores", &MachineCosts::cores)
      .def_readwrite("local_ranks", &MachineCosts::local_ranks)
      .def_readwrite("any_tcp", &MachineCosts::any_tcp);

  py::class_<AlgoChoice>(m, "AlgoChoice",
                         "algo='auto' for a stated machine and topology, without ranks (runtime/algo_choice.h).")
      .def(py::init([](int nranks, std::vector<int64_t> hosts, const MachineCosts& costs, uint64_t oneshot_bytes,
                       int forced) {
             ChoiceSetup setup;
             setup.nranks = nranks;
             if (!hosts.empty()) setup.topology = Topology::from_labels(hosts);
             setup.costs = costs;
             setup.oneshot_bytes = oneshot_bytes;
             setup.forced = checked_enum(forced, Algo::Count, "algo");
             auto choice = std::make_unique<AlgoChoice>();
             choice->configure(setup);
             return choice;
           }),
           py::arg("nranks"), py::arg("hosts") = std::vector<int64_t>{}, py::arg("costs") = MachineCosts{},
           py::arg("oneshot_bytes") = 0, py::arg("forced") = 0,
           "hosts: a host label per rank (empty: one host); oneshot_bytes: the one-shot capacity (0: none); "
           "forced: RINGTREE_ALGO's algo code (0: auto).")
      .def(
          "choose",
          [](const AlgoChoice& c, int coll, int algo, uint64_t bytes, int dtype, int op, bool deterministic) {
            return static_cast<int>(c.choose(checked_enum(coll, Collective::Count, "collective"),
                                             checked_enum(algo, Algo::Count, "algo"), bytes,
                                             checked_enum(dtype, DataType::Count, "dtype"),
                                             checked_enum(op, ReduceOp::Count, "reduce op"), deterministic));
          },
          py::arg("coll"), py::arg("algo"), py::arg("bytes"), py::arg("dtype") = static_cast<int>(DataType::Float32),
          py::arg("op") = 0, py::arg("deterministic") = false)
      .def(
          "estimate",
          [](const AlgoChoice& c, int coll, uint64_t bytes, int dtype, bool deterministic) {
            return estimate_tuples(c.estimate(checked_enum(coll, Collective::Count, "collective"), bytes,
                                              checked_enum(dtype, DataType::Count, "dtype"), deterministic));
          },
          py::arg("coll"), py::arg("bytes"), py::arg("dtype") = static_cast<int>(DataType::Float32),
          py::arg("deterministic") = false)
      .def(
          "oneshot_fits",
          [](const AlgoChoice& c, int coll, uint64_t bytes) {
            return c.oneshot_fits(checked_enum(coll, Collective::Count, "collective"), bytes);
          },
          py::arg("coll"), py::arg("bytes"))
      .def("set_choice_hook", [](AlgoChoice& c, py::object fn) { c.set_hook(choice_hook_of(fn)); }, py::arg("hook"));

  m.def(
      "wait_policy",
      [](int local_ranks, int cpu_sharers, int cpus, int online_cpus, int64_t spin_us, int64_t yield_us) {
        WaitCounts counts;
        counts.local_ranks = local_ranks;
        counts.cpu_sharers = cpu_sharers;
        counts.cpus = cpus;
        counts.online_cpus = online_cpus;
        counts.spin_us = spin_us;
        counts.yield_us = yield_us;
        const WaitDecision d = decide_wait_policy(counts);
        py::dict out;
        out["spin_ns"] = d.policy.spin_ns;
        out["yield_ns"] = d.policy.yield_ns;
        out["oversubscribed"] = d.oversubscribed;
        out["text"] = d.text;
        return out;
      },
      py::arg("local_ranks"), py::arg("cpu_sharers"), py::arg("cpus"), py::arg("online_cpus"), py::arg("spin_us") = -1,
      py::arg("yield_us") = -1,
      "The wait policy decide_wait_policy() makes of these counts: {spin_ns, yield_ns, oversubscribed, text}.");
}

}  // namespace ringtree
