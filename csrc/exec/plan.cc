// Validation and lowering of one call (see plan.h).
#include "exec/plan.h"

#include <cmath>
#include "common/check.h"
#include "common/hash.h"
#include "common/settings.h"

namespace ringtree {

namespace {

RT_SETTING(Deterministic)

// The buffer-size check of each collective, with the message users have always seen.
void check_sizes(const CollectiveTraits& t, const Buffer& in, const Buffer& out, uint64_t P, bool is_root) {
  switch (t.coll) {
    case Collective::AllReduce:
      RT_CHECK_EQ(out.count, in.count, "all_reduce: output element count must equal the input's");
      break;
    case Collective::ReduceScatter:
      RT_CHECK_EQ(
          in.count, out.count * P,
          str_cat("reduce_scatter: input element count must be output count x world size (", out.count, " x ", P, ")"));
      break;
    case Collective::AllGather:
      RT_CHECK_EQ(
          out.count, in.count * P,
          str_cat("all_gather: output element count must be input count x world size (", in.count, " x ", P, ")"));
      break;
    case Collective::AllToAll:
      RT_CHECK_EQ(out.count, in.count, "all_to_all: output element count must equal the input's");
      RT_CHECK(in.count % P == 0, InvalidArgument, "all_to_all: element count ", in.count,
               " is not divisible by the world size ", P);
      break;
    case Collective::Reduce:
      if (is_root) RT_CHECK_EQ(out.count, in.count, "reduce: output element count on the root must equal the input's");
      break;
    case Collective::Gather:
      if (is_root)
        RT_CHECK_EQ(out.count, in.count * P,
                    str_cat("gather: output element count on the root must be input count x world size (", in.count,
                            " x ", P, ")"));
      break;
    case Collective::Scatter:
      if (is_root)
        RT_CHECK_EQ(in.count, out.count * P,
                    str_cat("scatter: input element count on the root must be output count x world size (", out.count,
                            " x ", P, ")"));
      break;
    default:
      break;
  }
}

void check_all_to_all_v(const CollectiveArgs& a, const Buffer& in, const Buffer& out, uint64_t P, int rank) {
  RT_CHECK_EQ(a.send_counts.size(), P, "all_to_all_v: send_counts must have one entry per rank");
  RT_CHECK_EQ(a.recv_counts.size(), P, "all_to_all_v: recv_counts must have one entry per rank");
  uint64_t sent = 0, received = 0;
  for (uint64_t n : a.send_counts) sent += n;
  for (uint64_t n : a.recv_counts) received += n;
  RT_CHECK_EQ(in.count, sent, "all_to_all_v: input element count must equal sum(send_counts)");
  RT_CHECK_EQ(out.count, received, "all_to_all_v: output element count must equal sum(recv_counts)");
  RT_CHECK_EQ(
      a.recv_counts[rank], a.send_counts[rank],
      str_cat("all_to_all_v: recv_counts[", rank, "] must equal send_counts[", rank, "] (this rank's own block)"));
}

// Buffers may overlap only in the in-place layouts the collective's traits allow.
void check_overlap(const CollectiveTraits& t, const Buffer& in, const Buffer& out, size_t esz, uint64_t count, int rank,
                   bool is_root) {
  if (!in.present || !out.present || t.in_place == InPlace::OneBuffer) return;
  const size_t in_bytes = in.count * esz, out_bytes = out.count * esz;
  const auto* ip = static_cast<const uint8_t*>(in.ptr);
  const auto* op = static_cast<const uint8_t*>(out.ptr);
  const size_t block = count * esz;
  const bool root_side = !t.rooted || is_root;
  const char* name = collective_name(t.coll);
  bool allowed = false;
  switch (t.in_place) {
    case InPlace::SameBuffer:
      allowed = in.ptr == out.ptr;
      break;
    case InPlace::StagedSameBuffer:
      allowed = true;
      break;
    case InPlace::InputIsOutputBlock:
      allowed = root_side && ip == op + static_cast<size_t>(rank) * block;
      break;
    case InPlace::OutputIsInputBlock:
      allowed = root_side && op == ip + static_cast<size_t>(rank) * block;
      break;
    default:
      break;
  }
  if (t.point_to_point)
    RT_CHECK(!ranges_overlap(in.ptr, in_bytes, out.ptr, out_bytes), InvalidArgument, name,
             ": the send and receive buffers overlap");
  if (!allowed)
    RT_CHECK(!ranges_overlap(in.ptr, in_bytes, out.ptr, out_bytes), InvalidArgument, name,
             ": input and output overlap; in place means the same buffer for all_reduce, reduce and",
             " all_to_all, and this rank's block of the larger buffer for all_gather, gather, reduce_scatter",
             " and scatter");
}

}  // namespace

uint64_t Fingerprint::tag() const {
  uint64_t h = kFnvOffset;
  for (uint64_t v : {static_cast<uint64_t>(coll), static_cast<uint64_t>(algo), static_cast<uint64_t>(dtype),
                     static_cast<uint64_t>(op), static_cast<uint64_t>(static_cast<int64_t>(root)), count, seq,
                     uint64_t{deterministic}})
    h = fnv1a(h, v);
  return h | 1;
}

std::string describe(const Fingerprint& fp) {
  const char* dtype = dtype_name(fp.dtype);
  if (fp.coll == Collective::Send)
    return str_cat("send/recv (p2p #", fp.seq, ", count=", fp.count, ", dtype=", dtype, ")");
  std::string d = str_cat(collective_name(fp.coll), " #", fp.seq, " (count=", fp.count, ", dtype=", dtype);
  if (fp.op != Fingerprint::kNoOp) d += str_cat(", op=", op_name(static_cast<ReduceOp>(fp.op)));
  if (fp.root >= 0) d += str_cat(", root=", fp.root);
  return d + str_cat(", algo=", algo_name(fp.algo), fp.deterministic ? ", deterministic" : "", ")");
}

Fingerprint CallPlan::fingerprint(uint64_t seq) const {
  Fingerprint f;
  // Point-to-point messages all carry "send": a sendrecv matches a plain recv or send.
  const Collective c = collective_traits(key.coll).point_to_point ? Collective::Send : key.coll;
  f.coll = c;
  f.dtype = c == Collective::Barrier ? DataType::Int8 : dtype;  // a barrier has no data type
  f.op = collective_traits(c).reduction ? static_cast<uint8_t>(op) : Fingerprint::kNoOp;
  f.algo = key.algo;
  f.root = collective_traits(c).rooted ? key.root : -1;
  f.seq = seq;
  f.count = key.count;
  f.deterministic = collective_traits(c).reduction && deterministic;
  return f;
}

bool deterministic_setting() { return Deterministic() != 0; }

bool deterministic_mode(const CollectiveArgs& a) { return a.deterministic || deterministic_setting(); }

bool needs_rank_order(const CollectiveArgs& a) {
  return deterministic_mode(a) && is_reduction(a.coll) && dtype_is_floating(a.dtype);
}

ValidatedCall validate_call(const CollectiveArgs& a, int rank, int nranks) {
  RT_CHECK(a.dtype < DataType::Count, InvalidArgument, "unsupported dtype code ", static_cast<int>(a.dtype));
  const Collective c = a.coll;
  RT_CHECK(c < Collective::Count, InvalidArgument, "unknown collective code ", static_cast<int>(c));
  const CollectiveTraits& t = collective_traits(c);
  const char* name = collective_name(c);
  const size_t esz = dtype_size(a.dtype);
  const uint64_t P = static_cast<uint64_t>(nranks);
  if (t.reduction) {
    RT_CHECK(a.op < ReduceOp::Count, InvalidArgument, name, ": unknown reduce op code ", static_cast<int>(a.op));
    RT_CHECK(a.op != ReduceOp::PremulSum || std::isfinite(a.premul_factor), InvalidArgument, name,
             ": premul_sum factor must be finite, got ", a.premul_factor);
    RT_CHECK(!is_bitwise(a.op) || !dtype_is_floating(a.dtype), InvalidArgument, name, ": ", op_name(a.op),
             " needs an integer dtype, got ", dtype_name(a.dtype));
    RT_CHECK(!dtype_is_complex(a.dtype) || (a.op != ReduceOp::Min && a.op != ReduceOp::Max), InvalidArgument, name,
             ": ", op_name(a.op), " needs an ordered dtype; complex numbers have no order (got ", dtype_name(a.dtype),
             ")");
  }
  if (t.rooted)
    RT_CHECK(a.root >= 0 && a.root < nranks, InvalidArgument, name, ": root must be in [0, ", nranks, "), got ",
             a.root);
  if (t.point_to_point) {
    RT_CHECK(a.peer >= 0 && a.peer < nranks, InvalidArgument, name, ": peer must be in [0, ", nranks, "), got ",
             a.peer);
    RT_CHECK(a.peer != rank, InvalidArgument, name, ": peer must differ from this rank (", rank, ")");
  }
  if (c == Collective::SendRecv) {
    RT_CHECK(a.recv_peer >= 0 && a.recv_peer < nranks, InvalidArgument, name, ": source must be in [0, ", nranks,
             "), got ", a.recv_peer);
    RT_CHECK(a.recv_peer != rank, InvalidArgument, name, ": source must differ from this rank (", rank, ")");
  }
  const bool is_root = t.rooted && a.root == rank;
  Buffer in = a.input, out = a.output;
  if (t.needs_input(is_root)) RT_CHECK(in.present, InvalidArgument, name, ": rank ", rank, " needs an input buffer");
  // A reduce root without an output reduces in place; broadcast has one buffer.
  if (c == Collective::Reduce && is_root && !out.present) out = in;
  if (t.in_place == InPlace::OneBuffer) out = in;
  if (t.needs_output(is_root)) RT_CHECK(out.present, InvalidArgument, name, ": rank ", rank, " needs an output buffer");
  for (const Buffer* b : {&in, &out})
    RT_CHECK(!b->present || b->ptr || b->count == 0, InvalidArgument, name, ": null buffer with ", b->count,
             " elements");
  if (t.in_place == InPlace::OneBuffer) {
    if (!is_root)
      RT_CHECK(!in.readonly, InvalidArgument, name, ": the buffer is read-only but rank ", rank, " receives into it");
  } else if (t.needs_output(is_root)) {
    RT_CHECK(!out.readonly, InvalidArgument, name, ": the output buffer is read-only");
  }

  if (c == Collective::AllToAllV)
    check_all_to_all_v(a, in, out, P, rank);
  else
    check_sizes(t, in, out, P, is_root);
  ValidatedCall v;
  v.count = t.count_from(in.count, out.count, nranks);
  check_overlap(t, in, out, esz, v.count, rank, is_root);
  v.input = in;
  v.output = out;
  return v;
}

CallPlan lower(const CollectiveArgs& a, const ValidatedCall& v, int rank, int nranks, Algo algo, double timeout_s,
               uint64_t segment_bytes, const Topology* topo, bool stage_in_schedule) {
  const Collective c = a.coll;
  const CollectiveTraits& t = collective_traits(c);
  CallPlan p;
  const bool p2p_key = c == Collective::Send || c == Collective::Recv;
  p.key = ScheduleKey{c, algo, nranks, rank, v.count, t.rooted ? a.root : 0, 0, p2p_key ? a.peer : -1};
  p.key.segment = pipeline_segment(c, algo, dtype_size(a.dtype), segment_bytes);
  p.key.topo = is_hier(algo) ? topo : nullptr;  // flat schedules stay one cache entry whatever the hosts
  p.dtype = a.dtype;
  p.op = t.reduction ? a.op : ReduceOp::Sum;
  p.combine = p.op == ReduceOp::Avg || p.op == ReduceOp::PremulSum ? ReduceOp::Sum : p.op;
  p.premul_factor = a.premul_factor;
  p.deterministic = deterministic_mode(a);
  p.input = v.input;
  p.output = v.output;
  p.timeout_s = timeout_s;
  p.args = &a;
  const size_t esz = dtype_size(a.dtype);
  if (t.reduction && a.op == ReduceOp::PremulSum && p.input.present && p.input.count > 0) {
    p.pre = PreStep::ScaleInput;
    p.pre_elems = p.input.count;
  } else if (stage_in_schedule && c == Collective::AllToAll && algo == Algo::Direct && nranks > 1 &&
             p.input.count > 0 && p.input.ptr == p.output.ptr) {  // equal counts: validate_call
    p.key.same_buffer = true;
  } else if (t.in_place == InPlace::StagedSameBuffer && algo != Algo::OneShot && p.input.count > 0 &&
             ranges_overlap(p.input.ptr, p.input.count * esz, p.output.ptr, p.output.count * esz)) {
    // One-shot publishes a copy of the input anyway; a schedule must send from one.
    p.pre = PreStep::CopyInput;
    p.pre_elems = p.input.count;
  }
  const bool owns_result = !t.rooted || a.root == rank;
  if (t.reduction && a.op == ReduceOp::Avg && owns_result) {
    p.post = PostStep::DivideOutput;
    p.post_elems = p.output.count;
    p.divisor = nranks;
  }
  return p;
}

}  // namespace ringtree
