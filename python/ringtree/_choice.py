"""The replaceable step of algo="auto": a hook that sees the candidates with their predicted
costs and returns the algorithm to run (Communicator.set_algo_hook; docs: choosing.md)."""

from __future__ import annotations

from dataclasses import dataclass

from . import _core
from ._args import ALGO_CODES


@dataclass(frozen=True)
class ChoiceRequest:
    """One call as an algorithm hook sees it (see Communicator.set_algo_hook)."""

    collective: str
    """The collective's name ('all_reduce', ...)."""
    nbytes: int
    """One rank's block in bytes, the whole buffer for all_reduce, broadcast and reduce."""
    dtype: str
    """The element type's name ('float32', ...)."""
    nranks: int
    """The communicator's size."""
    nhosts: int
    """How many hosts its ranks are on."""
    candidates: tuple
    """(algo, predicted seconds, formula) for every algorithm the cost model weighed, in its order."""
    model_choice: str
    """The algorithm the cost model would run."""

    @classmethod
    def from_core(cls, raw) -> ChoiceRequest:
        coll, nbytes, dtype, nranks, nhosts, candidates, model = raw
        return cls(
            collective=_core.COLLECTIVES[coll],
            nbytes=int(nbytes),
            dtype=_core.DTYPES[dtype],
            nranks=int(nranks),
            nhosts=int(nhosts),
            candidates=tuple((_core.ALGOS[a], float(s), formula) for a, s, formula in candidates),
            model_choice=_core.ALGOS[model],
        )


def core_hook(hook):
    """The callable the core calls: hook(ChoiceRequest) answers an algorithm's name, or None for
    the cost model's choice; the core checks that the answer is a candidate."""
    if hook is None:
        return None
    if not callable(hook):
        raise _core.InvalidArgument(f"set_algo_hook: the hook must be callable (or None), got {hook!r}")

    def call(raw):
        request = ChoiceRequest.from_core(raw)
        answer = hook(request)
        if answer is None:
            return ALGO_CODES[request.model_choice]
        if not isinstance(answer, str) or answer.lower() not in ALGO_CODES:
            raise _core.InvalidArgument(
                f"the algorithm hook returned {answer!r} for {request.collective} of "
                f"{request.nbytes} bytes; it must return an algorithm's name (one of "
                f"{', '.join(a for a, _, _ in request.candidates)}) or None"
            )
        return ALGO_CODES[answer.lower()]

    return call
