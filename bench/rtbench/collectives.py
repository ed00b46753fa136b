"""What each collective moves: buffer counts, busbw factor, in-place layout.

Terms used throughout the bench:
  P      number of ranks
  N      the count column: elements per rank block for blocked collectives
         (reduce_scatter, all_gather, all_to_all, gather, scatter), else the
         element count of the whole buffer
  size   bytes of the larger of the send and receive buffers (nccl-tests)
  placement  "oop" (separate send and receive buffers) or "ip" (in place, with
         NCCL's aliasing: the rank's own block of the larger buffer is the smaller one)
"""

from __future__ import annotations

from dataclasses import dataclass

import ringtree as rt

from .options import COLLECTIVES

OOP, IP = "oop", "ip"
PLACEMENTS = (OOP, IP)


@dataclass(frozen=True)
class Collective:
    """A collective as the bench drives it, built from ringtree's own description of it
    (rt.collective_info), so buffer shapes and busbw factors are never re-derived here."""

    name: str
    info: rt.CollectiveInfo

    @property
    def reduction(self) -> bool:
        return self.info.reduction

    @property
    def rooted(self) -> bool:
        return self.info.rooted

    @property
    def blocked(self) -> bool:
        return self.info.blocked

    def busbw_factor(self, nranks: int) -> float:
        """algbw -> busbw: the fraction of the data each rank's link must carry (nccl-tests'
        factors, as csrc/common/collective.h states them)."""
        return self.info.busbw_factor(nranks)

    def count_for_bytes(self, nbytes: int, itemsize: int, nranks: int) -> int:
        """N for a requested size; rounded down, so the printed size can be smaller."""
        return nbytes // (itemsize * nranks) if self.blocked else nbytes // itemsize

    def _sizes(self, n: int, nranks: int) -> tuple[int, int]:
        # The root's (or every rank's) buffers; sendrecv's free sizes are n each way.
        if self.info.point_to_point:
            return n, n
        return self.info.buffer_sizes(n, nranks, True)

    def send_count(self, n: int, nranks: int) -> int:
        return self._sizes(n, nranks)[0]

    def recv_count(self, n: int, nranks: int) -> int:
        # broadcast has one buffer: what the root sends is what the others receive
        return self._sizes(n, nranks)[1] or self._sizes(n, nranks)[0]

    def size_bytes(self, n: int, itemsize: int, nranks: int) -> int:
        return max(self.send_count(n, nranks), self.recv_count(n, nranks)) * itemsize

    def inplace_views(self, buf, n: int, nranks: int, rank: int):
        """(input, output) views of one buffer for the in-place variant."""
        own = slice(rank * n, (rank + 1) * n)
        whole = slice(0, n * nranks)
        if self.info.in_place == "output_is_input_block":
            return buf[whole], buf[own]
        if self.info.in_place == "input_is_output_block":
            return buf[own], buf[whole]
        if self.info.in_place == "staged_same_buffer":
            return buf[whole], buf[whole]
        return buf[:n], buf[:n]

    def views(self, placement: str, send_buf, recv_buf, n: int, nranks: int, rank: int):
        """(input, output) for a placement; send_buf must hold max(send, recv) counts."""
        if placement == IP:
            return self.inplace_views(send_buf, n, nranks, rank)
        return send_buf[: self.send_count(n, nranks)], recv_buf[: self.recv_count(n, nranks)]

    def output_checked_on(self, rank: int, root: int) -> bool:
        """Rooted collectives without an output off the root define it on the root only (reduce, gather)."""
        return (
            rank == root
            if self.rooted and self.info.output_elsewhere == "none" and self.info.output_on_root != "none"
            else True
        )


COLLECTIVE_SPECS = {name: Collective(name, rt.collective_info(name)) for name in COLLECTIVES}


def get(name: str) -> Collective:
    return COLLECTIVE_SPECS[name]


def bandwidths(size_bytes: int, seconds: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, GB = 1e9 bytes; 0 for a zero or unmeasured time."""
    if not seconds or seconds <= 0:
        return 0.0, 0.0
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * factor
