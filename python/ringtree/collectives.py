"""What each collective takes and moves, read from the C++ core's one description of it
(csrc/common/collective.h), so the bench, the tests and user code never re-derive it.

    info = rt.collective_info("all_gather")
    info.buffer_sizes(count=4, nranks=3)    # (4, 12): input and output elements on a rank
    info.busbw_factor(4)                     # 0.75
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _core

__all__ = ["CollectiveInfo", "collective_info", "COLLECTIVES"]

COLLECTIVES = tuple(_core.COLLECTIVES)


@dataclass(frozen=True)
class CollectiveInfo:
    """One collective. Buffer multiples: "none" (no such buffer on that side), "one" (count
    elements), "world" (count x P) or "free" (sizes given per call). The count is the schedule's:
    the whole buffer for all_reduce, broadcast, reduce, send and recv, one rank's block otherwise."""

    name: str
    code: int
    reduction: bool
    rooted: bool
    point_to_point: bool
    in_place: str  # none, same_buffer, staged_same_buffer, one_buffer, input_is_output_block, output_is_input_block
    input_on_root: str
    output_on_root: str
    input_elsewhere: str
    output_elsewhere: str

    @property
    def blocked(self) -> bool:
        """Some buffer holds one block of `count` per rank."""
        return "world" in (self.input_on_root, self.output_on_root, self.input_elsewhere, self.output_elsewhere)

    def buffer_sizes(self, count: int, nranks: int, is_root: bool = True) -> tuple[int, int]:
        """(input, output) elements of one rank's buffers; 0 where the rank has no such buffer."""
        return tuple(_core.buffer_sizes(self.code, count, nranks, is_root))

    def busbw_factor(self, nranks: int) -> float:
        """Bus bandwidth over algorithm bandwidth (nccl-tests' definition)."""
        return _core.busbw_factor(self.code, nranks)


def collective_info(name: str) -> CollectiveInfo:
    """The description of collective `name` (one of COLLECTIVES)."""
    if name not in _core.COLLECTIVE_TRAITS:
        raise ValueError(f"unknown collective {name!r}; choose from {', '.join(COLLECTIVES)}")
    return CollectiveInfo(name=name, code=COLLECTIVES.index(name), **_core.COLLECTIVE_TRAITS[name])
