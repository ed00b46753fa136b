// Schedules as data, for the transport-free checks and for explaining an algorithm.
#include <pybind11/stl.h>
#include <memory>
#include "algorithms/pricing.h"
#include "algorithms/schedule.h"
#include "bindings/bindings.h"

namespace py = pybind11;

namespace ringtree {

namespace {

py::dict counts_dict(const ScheduleCounts& k) {
  return py::dict(py::arg("steps") = k.steps, py::arg("hops") = k.hops, py::arg("sent") = k.sent,
                  py::arg("received") = k.received, py::arg("reduced") = k.reduced, py::arg("copied") = k.copied,
                  py::arg("remote_hops") = k.remote_hops, py::arg("remote_sent") = k.remote_sent,
                  py::arg("remote_received") = k.remote_received, py::arg("remote_reduced") = k.remote_reduced,
                  py::arg("remote_link") = k.remote_link, py::arg("published") = k.published,
                  py::arg("host_net") = k.host_net, py::arg("host_reduced") = k.host_reduced,
                  py::arg("host_copied") = k.host_copied, py::arg("handshakes") = k.handshakes);
}

// A topology from per-rank host labels, or none (hier keys then fail with a clear error).
std::unique_ptr<Topology> topology_of(const std::vector<int64_t>& hosts) {
  if (hosts.empty()) return nullptr;
  return std::make_unique<Topology>(Topology::from_labels(hosts));
}

}  // namespace

void register_schedules(py::module_& m) {
  m.def(
      "verify_schedules",
      [](int coll, int algo, int nranks, uint64_t count, int root, uint64_t segment, int drop_op, bool oneshot_rules,
         std::vector<int64_t> hosts, bool claim_rank_fold, bool same_buffer) {
        const auto topo = topology_of(hosts);
        ScheduleKey k{
            static_cast<Collective>(coll), static_cast<Algo>(algo), nranks, 0, count, root, segment, -1, topo.get()};
        k.same_buffer = same_buffer;
        return verify_schedules(k, drop_op, oneshot_rules, claim_rank_fold);
      },
      py::arg("coll"), py::arg("algo"), py::arg("nranks"), py::arg("count"), py::arg("root") = 0,
      py::arg("segment") = 0, py::arg("drop_op") = -1, py::arg("oneshot_rules") = true,
      py::arg("hosts") = std::vector<int64_t>{}, py::arg("claim_rank_fold") = false, py::arg("same_buffer") = false,
      py::call_guard<py::gil_scoped_release>(),
      "Run every rank's schedule against the others without a transport; raises Error on any violation.\n"
      "drop_op removes that op of rank 0's schedule (a fault to report); oneshot_rules=False leaves out the\n"
      "one-shot per-call rules, so that the other checks must find the fault. hosts: a host label per\n"
      "rank, the topology of the hierarchical algorithms. claim_rank_fold: every reduction must also have the\n"
      "shape of the rank-order left fold, as one-shot and rank_order reductions always must. same_buffer: the\n"
      "direct all_to_all schedule for one buffer, checked with its input and output aliased.");
  m.def(
      "schedule_counts",
      [](int coll, int algo, int nranks, uint64_t count, int root, uint64_t segment, std::vector<int64_t> hosts) {
        ScheduleCounts k;
        {
          py::gil_scoped_release release;
          const auto topo = topology_of(hosts);
          k = count_schedules(ScheduleKey{static_cast<Collective>(coll), static_cast<Algo>(algo), nranks, 0, count,
                                          root, segment, -1, topo.get()});
        }
        return counts_dict(k);
      },
      py::arg("coll"), py::arg("algo"), py::arg("nranks"), py::arg("count"), py::arg("root") = 0,
      py::arg("segment") = 0, py::arg("hosts") = std::vector<int64_t>{},
      "What the cost model counts in every rank's schedule: the most steps of one rank, the hops on the\n"
      "critical path, and the elements the busiest rank sends, receives, reduces and copies; with hosts (a\n"
      "label per rank), how many of those hops and elements cross hosts (remote_*), weighing both alike.");
  m.def(
      "price_table_counts",
      [](int coll, int algo, int nranks, uint64_t bytes, std::vector<int64_t> hosts) {
        const auto topo = topology_of(hosts);
        PriceTable table;
        table.build(nranks, topo.get());
        return counts_dict(table.counts(static_cast<Collective>(coll), static_cast<Algo>(algo), bytes));
      },
      py::arg("coll"), py::arg("algo"), py::arg("nranks"), py::arg("bytes"), py::arg("hosts") = std::vector<int64_t>{},
      "schedule_counts as the cost model's table at P ranks has them for a call of `bytes` (interpolated\n"
      "between the sizes it counted, and extended past them), with the segment setting.");
  m.def("hier_algos", [](int coll) {
    std::vector<int> out;
    for (Algo a : hier_algos(static_cast<Collective>(coll))) out.push_back(static_cast<int>(a));
    return out;
  });
  m.def("supported_algos", [](int coll) {
    std::vector<int> out;
    for (Algo a : supported_algos(static_cast<Collective>(coll))) out.push_back(static_cast<int>(a));
    return out;
  });
  m.def(
      "schedule",
      [](int coll, int algo, int nranks, int rank, uint64_t count, int root, uint64_t segment, int peer,
         std::vector<int64_t> hosts, bool same_buffer) {
        const auto topo = topology_of(hosts);
        ScheduleKey k{static_cast<Collective>(coll),
                      static_cast<Algo>(algo),
                      nranks,
                      rank,
                      count,
                      root,
                      segment,
                      peer,
                      topo.get()};
        k.same_buffer = same_buffer;
        Schedule s = build_schedule(k);
        static const char* kinds[] = {"send",    "recv",           "recv_reduce",     "copy",
                                      "publish", "copy_published", "reduce_published"};
        auto buf = [](BufId b) {
          return b == BufId::Published ? "published"
                 : b == BufId::Output  ? "output"
                 : b == BufId::Scratch ? "scratch"
                                       : "input";
        };
        py::list steps;
        for (size_t i = 0; i < s.num_steps(); ++i) {
          py::list ops;
          for (uint32_t j = s.step_begin(i); j < s.step_end[i]; ++j) {
            const Op& op = s.ops[j];
            ops.append(py::make_tuple(kinds[static_cast<int>(op.kind)], op.peer, op.count,
                                      py::make_tuple(buf(op.dst.buf), op.dst.offset),
                                      py::make_tuple(buf(op.src.buf), op.src.offset), op.lhs_peer));
          }
          steps.append(ops);
        }
        return steps;
      },
      py::arg("coll"), py::arg("algo"), py::arg("nranks"), py::arg("rank"), py::arg("count"), py::arg("root") = 0,
      py::arg("segment") = 0, py::arg("peer") = -1, py::arg("hosts") = std::vector<int64_t>{},
      py::arg("same_buffer") = false,
      "One rank's schedule as a list of steps, each a list of (kind, peer, count, (dst buf, offset), (src buf, "
      "offset),\n"
      "lhs_peer). One-shot ops read buffer 'published' of rank peer; reduce_published with lhs_peer >= 0 reduces\n"
      "lhs_peer's publication with peer's, else dst with peer's.");
}

}  // namespace ringtree
