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

OOP, IP = "oop", "ip"
PLACEMENTS = (OOP, IP)


@dataclass(frozen=True)
class Collective:
    name: str
    reduction: bool   # takes an op
    rooted: bool      # takes a root
    blocked: bool     # buffers are P blocks of N elements
    send_blocks: int  # send count = N * (P if send_blocks else 1)
    recv_blocks: int  # recv count = N * (P if recv_blocks else 1)

    def busbw_factor(self, nranks: int) -> float:
        """algbw -> busbw: the fraction of the data each rank's link must carry (DESIGN.md)."""
        if self.name == "all_reduce":
            return 2.0 * (nranks - 1) / nranks
        if self.name in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
            return (nranks - 1) / nranks
        return 1.0  # broadcast, reduce, sendrecv

    def count_for_bytes(self, nbytes: int, itemsize: int, nranks: int) -> int:
        """N for a requested size; rounded down, so the printed size can be smaller."""
        return nbytes // (itemsize * nranks) if self.blocked else nbytes // itemsize

    def send_count(self, n: int, nranks: int) -> int:
        return n * nranks if self.send_blocks else n

    def recv_count(self, n: int, nranks: int) -> int:
        return n * nranks if self.recv_blocks else n

    def size_bytes(self, n: int, itemsize: int, nranks: int) -> int:
        return max(self.send_count(n, nranks), self.recv_count(n, nranks)) * itemsize

    def inplace_views(self, buf, n: int, nranks: int, rank: int):
        """(input, output) views of one buffer for the in-place variant."""
        own = slice(rank * n, (rank + 1) * n)
        whole = slice(0, n * nranks)
        if self.name in ("reduce_scatter", "scatter"):
            return buf[whole], buf[own]
        if self.name in ("all_gather", "gather"):
            return buf[own], buf[whole]
        if self.name == "all_to_all":
            return buf[whole], buf[whole]
        return buf[:n], buf[:n]

    def views(self, placement: str, send_buf, recv_buf, n: int, nranks: int, rank: int):
        """(input, output) for a placement; send_buf must hold max(send, recv) counts."""
        if placement == IP:
            return self.inplace_views(send_buf, n, nranks, rank)
        return send_buf[:self.send_count(n, nranks)], recv_buf[:self.recv_count(n, nranks)]

    def output_checked_on(self, rank: int, root: int) -> bool:
        """Rooted collectives define the output on the root only (reduce, gather)."""
        return rank == root if self.name in ("reduce", "gather") else True


COLLECTIVE_SPECS = {c.name: c for c in (
    Collective("all_reduce", True, False, False, 0, 0),
    Collective("reduce_scatter", True, False, True, 1, 0),
    Collective("all_gather", False, False, True, 0, 1),
    Collective("all_to_all", False, False, True, 1, 1),
    Collective("broadcast", False, True, False, 0, 0),
    Collective("reduce", True, True, False, 0, 0),
    Collective("gather", False, True, True, 0, 1),
    Collective("scatter", False, True, True, 1, 0),
    Collective("sendrecv", False, False, False, 0, 0),
)}


def get(name: str) -> Collective:
    return COLLECTIVE_SPECS[name]


def bandwidths(size_bytes: int, seconds: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, GB = 1e9 bytes; 0 for a zero or unmeasured time."""
    if not seconds or seconds <= 0:
        return 0.0, 0.0
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * factor
