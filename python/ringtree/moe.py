"""Mixture-of-Experts token dispatch over all-to-all.

One MoE layer's exchange, on every rank::

    import ringtree.moe as moe
    expert_inputs, handle = moe.dispatch(tokens, expert_ids, expert_weights, num_experts, comm=comm)
    chunks = expert_inputs.split(handle.expert_counts)          # one per local expert
    outputs = torch.cat([experts[e](x) for e, x in zip(handle.local_experts, chunks)])
    y = moe.combine(outputs, handle)                              # [T, H], back at the origin

Terms:

- assignment: one (token, slot) pair of top-k routing; token t's slot j goes to expert
  expert_ids[t, j] with weight expert_weights[t, j]. Its flat index is t * k + j.
- placement: experts are spread evenly over the communicator's ranks; num_experts must be a
  multiple of the size P, and expert e lives on rank e // (num_experts // P). A rank's local
  experts are handle.local_experts.
- capacity: how many assignments one source rank may send to one expert,
  ceil(capacity_factor * T * k / num_experts) with T this rank's token count. This is GShard's
  per-group capacity (a group is a rank's batch): each rank decides what to drop from its own
  routing alone, with no extra round trip, and an expert receives at most P * capacity rows, so
  an overloaded expert costs bounded memory and time instead of stalling everyone.
  capacity_factor None (or inf) drops nothing.
- drop rule: an expert keeps a source rank's first `capacity` assignments in token order (flat
  index order: token t before t + 1, slot j before j + 1 within a token); the rest are dropped
  and counted per expert. A dropped assignment contributes zero to its token's output (the
  residual connection around an MoE layer usually carries those tokens).

Layout: `expert_inputs` is one tensor [N, H], expert-major: local expert 0's rows, then local
expert 1's, ...; within an expert, rows by source rank, then in token order. handle.expert_counts
(a list, one per local expert) splits it. combine takes the experts' outputs in that same layout
and shape.

Traffic: one all_to_all of counts (which also carries num_experts, H and the dtype, so ranks that
disagree raise on every rank before any token moves), then one all_to_all_v of tokens; combine
is the reverse all_to_all_v. With global_stats=True, one more small all_gather gives every rank
every expert's kept and dropped counts. torch CPU tensors go to the communicator as they are
(ringtree reads their memory directly), so the only copies are the gather of the rows to send
and the reordering of received rows into expert-major order (skipped with one local expert).

Autograd: dispatch's backward sends the gradients of expert_inputs back to their origins and
sums them per token (a combine without weights); combine's backward dispatches the output
gradient times each assignment's weight to the experts, and gives expert_weights the dot product
of the output gradient with each kept assignment's expert output (zero for dropped ones), so a
router can learn. Both backwards are collectives: every rank must run them, in the same order, as
it ran the forwards (the usual rule for collectives in a backward pass).
"""

from __future__ import annotations

import math
import sys

import torch
from torch.autograd.function import once_differentiable

from . import _core
from ._buffers import DTYPE_CODES, TORCH_DTYPES

__all__ = ["dispatch", "combine", "MoEHandle", "MoEStats"]

# Per peer in the count exchange: num_experts, H, dtype code, then the receiver's local experts'
# kept counts and dropped counts.
_HEADER = 3
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class MoEStats:
    """Kept and dropped assignment counts per expert (int64 tensors), as handle.stats."""

    __slots__ = {
        "capacity": "This rank's per-expert capacity; None means no dropping.",
        "kept": "[num_experts] this rank's kept assignments, per expert.",
        "dropped": "[num_experts] this rank's dropped assignments, per expert.",
        "expert_kept": "[experts per rank] assignments to this rank's local experts that arrived, from every rank.",
        "expert_dropped": "[experts per rank] assignments to this rank's local experts dropped at their source.",
        "global_kept": "[num_experts] every rank's kept assignments, per expert; None without global_stats.",
        "global_dropped": "[num_experts] every rank's dropped assignments, per expert; None without global_stats.",
    }

    def __init__(self, capacity, kept, dropped, expert_kept, expert_dropped):
        self.capacity, self.kept, self.dropped = capacity, kept, dropped
        self.expert_kept, self.expert_dropped = expert_kept, expert_dropped
        self.global_kept = self.global_dropped = None

    def __repr__(self):
        return (
            f"MoEStats(capacity={self.capacity}, kept={self.kept.tolist()}, dropped={self.dropped.tolist()}, "
            f"global_dropped={None if self.global_dropped is None else self.global_dropped.tolist()})"
        )


class MoEHandle:
    """What combine (and both backwards) need to reverse a dispatch."""

    __slots__ = {
        "comm": "The communicator the dispatch ran on.",
        "num_experts": "Experts over all ranks.",
        "k": "Experts per token.",
        "T": "Tokens on this rank.",
        "H": "Elements per token.",
        "dtype": "The tokens' dtype.",
        "expert_weights": "[T, k] the weights combine applies.",
        "kept_assignments": "Indices into the flattened [T, k] assignments of those kept.",
        "token_index": "The token of each kept assignment.",
        "send_counts": "Elements sent to each rank.",
        "recv_counts": "Elements received from each rank.",
        "expert_major": "The order that makes received rows expert-major; None when no reordering is needed.",
        "expert_counts": "Rows of expert_inputs per local expert.",
        "local_experts": "The range of this rank's experts.",
        "stats": "Kept and dropped counts (MoEStats).",
    }

    @property
    def rows(self) -> int:
        """Rows of expert_inputs (and of the expert outputs combine takes)."""
        return sum(self.expert_counts)


def _invalid(msg: str) -> Exception:
    return _core.InvalidArgument(msg)


def _default_comm():
    """The ringtree communicator of the default torch.distributed group, if that group runs on
    ringtree's backend (ringtree.torch); ringtree itself has no global communicator."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        comm = getattr(dist.group.WORLD, "comm", None)
        if comm is not None:
            return comm
    raise _invalid(
        "moe: pass comm= (a ringtree Communicator); without it the default torch.distributed group "
        "must run on the ringtree backend, and none does"
    )


def _capacity(capacity_factor, T: int, k: int, num_experts: int):
    if capacity_factor is None:
        return None
    try:
        factor = float(capacity_factor)
    except (TypeError, ValueError):
        raise _invalid(f"dispatch: capacity_factor must be a number or None, got {capacity_factor!r}") from None
    if math.isnan(factor) or factor < 0:
        raise _invalid(f"dispatch: capacity_factor must be >= 0 (or None / inf for no dropping), got {factor}")
    if math.isinf(factor):
        return None
    return math.ceil(factor * T * k / num_experts)


def _check_dispatch(tokens, expert_ids, expert_weights, num_experts, size):
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise _invalid(
            f"dispatch: tokens must be a [T, H] tensor, got "
            f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}"
        )
    if tokens.dtype not in _FLOAT_DTYPES:
        raise _invalid(f"dispatch: tokens must be float16, bfloat16, float32 or float64, got {tokens.dtype}")
    if not isinstance(expert_ids, torch.Tensor) or expert_ids.dim() != 2 or expert_ids.shape[0] != tokens.shape[0]:
        got = tuple(expert_ids.shape) if isinstance(expert_ids, torch.Tensor) else type(expert_ids).__name__
        raise _invalid(f"dispatch: expert_ids must be [T, k] with T = {tokens.shape[0]} (tokens' rows), got {got}")
    if expert_ids.shape[1] < 1:
        raise _invalid("dispatch: expert_ids must route each token to k >= 1 experts, got k = 0")
    if expert_ids.dtype.is_floating_point or expert_ids.dtype.is_complex or expert_ids.dtype == torch.bool:
        raise _invalid(f"dispatch: expert_ids must be an integer tensor, got {expert_ids.dtype}")
    if not isinstance(expert_weights, torch.Tensor) or expert_weights.shape != expert_ids.shape:
        got = tuple(expert_weights.shape) if isinstance(expert_weights, torch.Tensor) else type(expert_weights).__name__
        raise _invalid(f"dispatch: expert_weights must have expert_ids' shape {tuple(expert_ids.shape)}, got {got}")
    if not expert_weights.dtype.is_floating_point:
        raise _invalid(f"dispatch: expert_weights must be a float tensor, got {expert_weights.dtype}")
    if expert_ids.device != tokens.device or expert_weights.device != tokens.device:
        raise _invalid(
            f"dispatch: tokens, expert_ids and expert_weights must be on one device, got "
            f"{tokens.device}, {expert_ids.device}, {expert_weights.device}"
        )
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise _invalid(f"dispatch: num_experts must be a positive int, got {num_experts!r}")
    if num_experts % size:
        raise _invalid(
            f"dispatch: num_experts {num_experts} must be a multiple of the communicator's size {size} "
            f"(expert e lives on rank e // (num_experts // size))"
        )
    if expert_ids.numel():
        low, high = int(expert_ids.min()), int(expert_ids.max())
        if low < 0 or high >= num_experts:
            raise _invalid(f"dispatch: expert_ids must lie in [0, {num_experts}), got values from {low} to {high}")


def _route(flat_ids, num_experts: int, capacity):
    """(kept assignments by expert then token order, per-expert totals, per-expert kept counts)."""
    order = torch.argsort(flat_ids, stable=True)
    totals = torch.bincount(flat_ids, minlength=num_experts)
    if capacity is None:
        return order, totals, totals
    first = torch.cumsum(totals, 0) - totals  # where each expert's run starts in `order`
    position = torch.arange(order.numel(), device=order.device) - first[flat_ids[order]]
    return order[position < capacity], totals, totals.clamp(max=capacity)


def _expert_major(received):
    """The permutation taking rows received by source (source, then local expert) into
    expert-major order (local expert, then source). received: [P, experts per rank] row counts."""
    seg_len = received.t().reshape(-1)
    flat = received.reshape(-1)
    src_start = (torch.cumsum(flat, 0) - flat).view_as(received).t().reshape(-1)
    dst_start = torch.cumsum(seg_len, 0) - seg_len
    total = int(seg_len.sum())
    return torch.repeat_interleave(src_start - dst_start, seg_len, output_size=total) + torch.arange(total)


def _exchange_counts(comm, handle, kept, dropped, per_rank, global_stats):
    """The count exchange, checking that every rank agrees on num_experts, H and dtype."""
    P, E = comm.size, handle.num_experts
    send = torch.empty(P, _HEADER + 2 * per_rank, dtype=torch.int64)
    send[:, 0], send[:, 1], send[:, 2] = E, handle.H, DTYPE_CODES[TORCH_DTYPES[str(handle.dtype)]]
    send[:, _HEADER : _HEADER + per_rank] = kept.view(P, per_rank)
    send[:, _HEADER + per_rank :] = dropped.view(P, per_rank)
    recv = torch.empty_like(send)
    try:
        comm.all_to_all(send, recv)
    except _core.CollectiveMismatch as exc:
        exc.add_note(
            f"moe.dispatch: the count exchange sends {_HEADER} + 2 * num_experts / P int64 per rank; "
            f"ranks that disagree on num_experts (here {E}) disagree on its size"
        )
        raise
    for column, what in ((0, "num_experts"), (1, "H (tokens' width)"), (2, "the tokens' dtype")):
        values = recv[:, column].tolist()
        if any(v != values[0] for v in values):
            shown = values if column != 2 else [_core.DTYPES[v] if 0 <= v < len(_core.DTYPES) else v for v in values]
            raise _invalid(f"dispatch: ranks disagree on {what}: rank r has {shown} (by rank); nothing was sent")
    received = recv[:, _HEADER : _HEADER + per_rank]
    expert_dropped = recv[:, _HEADER + per_rank :].sum(0)
    if global_stats:
        mine = torch.cat([received.sum(0), expert_dropped])
        everyone = torch.empty(P * 2 * per_rank, dtype=torch.int64)
        comm.all_gather(mine, everyone)
        everyone = everyone.view(P, 2, per_rank)
        return received, expert_dropped, everyone[:, 0].reshape(-1), everyone[:, 1].reshape(-1)
    return received, expert_dropped, None, None


def _to_experts(rows, handle):
    """Rows in the sender's order (by destination expert) -> expert-major rows on the experts'
    ranks: dispatch's forward and combine's backward."""
    received = rows.new_empty(handle.rows, handle.H)
    handle.comm.all_to_all_v(rows, received, handle.send_counts, handle.recv_counts)
    return received if handle.expert_major is None else received.index_select(0, handle.expert_major)


def _from_experts(rows, handle):
    """Expert-major rows -> the origin's rows in its send order: combine's forward and
    dispatch's backward."""
    rows = rows.contiguous()
    if handle.expert_major is not None:
        rows = rows.new_empty(rows.shape).index_copy_(0, handle.expert_major, rows)
    back = rows.new_empty(handle.token_index.numel(), handle.H)
    handle.comm.all_to_all_v(rows, back, handle.recv_counts, handle.send_counts)
    return back


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, handle):
        ctx.handle = handle
        return _to_experts(tokens.index_select(0, handle.token_index), handle)

    @staticmethod
    @once_differentiable  # the exchanges themselves are not differentiated again
    def backward(ctx, grad_inputs):
        h = ctx.handle
        back = _from_experts(grad_inputs, h)
        return back.new_zeros(h.T, h.H).index_add_(0, h.token_index, back), None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_outputs, expert_weights, handle):
        back = _from_experts(expert_outputs, handle)
        weights = expert_weights.reshape(-1).index_select(0, handle.kept_assignments).to(back.dtype)
        ctx.handle = handle
        ctx.weights_dtype = expert_weights.dtype
        ctx.save_for_backward(back, weights)
        return back.new_zeros(handle.T, handle.H).index_add_(0, handle.token_index, back * weights[:, None])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        h = ctx.handle
        back, weights = ctx.saved_tensors
        grad_rows = grad_out.index_select(0, h.token_index)
        grad_weights = None
        if ctx.needs_input_grad[1]:
            kept = (grad_rows * back).sum(1).to(ctx.weights_dtype)
            grad_weights = kept.new_zeros(h.T * h.k).index_copy_(0, h.kept_assignments, kept).view(h.T, h.k)
        # Always exchanged, even where this rank's experts need no gradient: the other ranks'
        # experts may, and a collective needs every rank.
        grad_experts = _to_experts((grad_rows * weights[:, None]).contiguous(), h)
        return grad_experts, grad_weights, None


def dispatch(
    tokens, expert_ids, expert_weights, num_experts: int, capacity_factor=1.0, comm=None, global_stats: bool = False
):
    """Send each token to the ranks of its top-k experts.

    T may differ between ranks; num_experts, H and the dtype may not (every rank raises if they
    do). Collective over `comm`.

    Parameters
    ----------
    tokens : torch.Tensor
        [T, H] float.
    expert_ids : torch.Tensor
        [T, k] int; expert e lives on rank e // (num_experts // P).
    expert_weights : torch.Tensor
        [T, k] float, used by combine.
    num_experts : int
        Experts over all ranks, a multiple of P.
    capacity_factor : float or None
        Scales each expert's capacity (see the module docstring); None or inf: nothing dropped.
    comm : Communicator or None
        The ranks; None: the one under the default torch.distributed group when that group runs
        on the ringtree backend.
    global_stats : bool
        True adds every expert's totals to handle.stats with one more small all_gather (every
        rank passes the same).

    Returns
    -------
    tuple
        (expert_inputs, handle): expert_inputs is [handle.rows, H], expert-major, split by
        handle.expert_counts; handle is the MoEHandle combine takes.

    Raises
    ------
    InvalidArgument
        Bad arguments (a ValueError), before any traffic; or no comm and no ringtree default
        group.
    """
    comm = _default_comm() if comm is None else comm
    _check_dispatch(tokens, expert_ids, expert_weights, num_experts, comm.size)
    T, H = tokens.shape
    k = expert_ids.shape[1]
    capacity = _capacity(capacity_factor, T, k, num_experts)
    P = comm.size
    per_rank = num_experts // P

    kept_assignments, totals, kept = _route(expert_ids.reshape(-1).long(), num_experts, capacity)
    kept, dropped = kept.cpu(), (totals - kept).cpu()
    h = MoEHandle()
    h.comm, h.num_experts, h.k, h.T, h.H, h.dtype = comm, num_experts, k, T, H, tokens.dtype
    h.expert_weights, h.kept_assignments = expert_weights, kept_assignments
    h.token_index = torch.div(kept_assignments, k, rounding_mode="floor")
    received, expert_dropped, global_kept, global_dropped = _exchange_counts(
        comm, h, kept, dropped, per_rank, global_stats
    )
    h.send_counts = (kept.view(P, per_rank).sum(1) * H).tolist()
    h.recv_counts = (received.sum(1) * H).tolist()
    h.expert_counts = received.sum(0).tolist()
    h.expert_major = None if P == 1 or per_rank == 1 else _expert_major(received).to(tokens.device)
    h.local_experts = range(comm.rank * per_rank, (comm.rank + 1) * per_rank)
    h.stats = MoEStats(capacity, kept, dropped, received.sum(0), expert_dropped)
    h.stats.global_kept, h.stats.global_dropped = global_kept, global_dropped
    return _Dispatch.apply(tokens, h), h


def combine(expert_outputs, handle: MoEHandle):
    """Return each expert output row to its token's rank, weighted by its assignment's weight;
    a token's row is the sum over its kept slots (dropped slots add zero). Collective.

    Parameters
    ----------
    expert_outputs : torch.Tensor
        [handle.rows, H] in expert_inputs' layout and dtype.
    handle : MoEHandle
        What dispatch returned.

    Returns
    -------
    torch.Tensor
        [T, H].

    Raises
    ------
    InvalidArgument
        Not a MoEHandle, or expert_outputs of another shape or dtype.
    """
    if not isinstance(handle, MoEHandle):
        raise _invalid(f"combine: handle must be the MoEHandle dispatch returned, got {type(handle).__name__}")
    if not isinstance(expert_outputs, torch.Tensor) or tuple(expert_outputs.shape) != (handle.rows, handle.H):
        got = tuple(expert_outputs.shape) if isinstance(expert_outputs, torch.Tensor) else type(expert_outputs).__name__
        raise _invalid(f"combine: expert_outputs must be [{handle.rows}, {handle.H}] like expert_inputs, got {got}")
    if expert_outputs.dtype != handle.dtype:
        raise _invalid(
            f"combine: expert_outputs must be {handle.dtype} like the dispatched tokens, got {expert_outputs.dtype}"
        )
    return _Combine.apply(expert_outputs, handle.expert_weights, handle)
