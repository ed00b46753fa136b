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
    """The collective's name, as in collective_info(name)."""
    code: int
    """Its index in the core's list of collectives."""
    reduction: bool
    """Whether it combines values with a reduction op."""
    rooted: bool
    """Whether it has a root rank (broadcast, reduce, gather, scatter)."""
    point_to_point: bool
    """Whether it is send, recv or sendrecv."""
    in_place: str  # none, same_buffer, staged_same_buffer, one_buffer, input_is_output_block, output_is_input_block
    """How an in-place call lays out its buffer, 'none', 'same_buffer', 'staged_same_buffer',
    'one_buffer', 'input_is_output_block' or 'output_is_input_block'."""
    input_on_root: str
    """The root's input buffer's multiple ('none', 'one', 'world' or 'free'); every rank's when
    not rooted."""
    output_on_root: str
    """The root's output buffer's multiple; every rank's when not rooted."""
    input_elsewhere: str
    """The other ranks' input buffer's multiple."""
    output_elsewhere: str
    """The other ranks' output buffer's multiple."""

    @property
    def blocked(self) -> bool:
        """Some buffer holds one block of `count` per rank."""
        return "world" in (self.input_on_root, self.output_on_root, self.input_elsewhere, self.output_elsewhere)

    def buffer_sizes(self, count: int, nranks: int, is_root: bool = True) -> tuple[int, int]:
        """The sizes of one rank's buffers for a call.

        Parameters
        ----------
        count : int
            The call's count, as the class describes it.
        nranks : int
            The communicator's size.
        is_root : bool
            Whether the rank is the root (ignored unless the collective is rooted).

        Returns
        -------
        tuple of int
            (input, output) in elements; 0 where the rank has no such buffer.
        """
        return tuple(_core.buffer_sizes(self.code, count, nranks, is_root))

    def busbw_factor(self, nranks: int) -> float:
        """Bus bandwidth over algorithm bandwidth (nccl-tests' definition).

        Parameters
        ----------
        nranks : int
            The communicator's size.

        Returns
        -------
        float
            The factor, e.g. 2 (P - 1) / P for all_reduce.
        """
        return _core.busbw_factor(self.code, nranks)


def collective_info(name: str) -> CollectiveInfo:
    """The description of a collective.

    Parameters
    ----------
    name : str
        One of COLLECTIVES ('all_reduce', 'reduce_scatter', ..., 'sendrecv').

    Returns
    -------
    CollectiveInfo
        Its traits, read from the C++ core.

    Raises
    ------
    ValueError
        `name` is not a collective.
    """
    if name not in _core.COLLECTIVE_TRAITS:
        raise ValueError(f"unknown collective {name!r}; choose from {', '.join(COLLECTIVES)}")
    return CollectiveInfo(name=name, code=COLLECTIVES.index(name), **_core.COLLECTIVE_TRAITS[name])
