"""The one description of each collective (csrc/common/collective.h) as Python sees it, against
the semantics the manual states (docs/concepts.md); and every error's kind naming its class."""

import pytest

import ringtree as rt

P = 4
N = 3
# docs/concepts.md, "Semantics of each collective": (input, output) elements on the root / on
# another rank, and busbw factor.
EXPECTED = {
    "all_reduce": ((N, N), (N, N), 2 * (P - 1) / P),
    "reduce_scatter": ((N * P, N), (N * P, N), (P - 1) / P),
    "all_gather": ((N, N * P), (N, N * P), (P - 1) / P),
    "all_to_all": ((N * P, N * P), (N * P, N * P), (P - 1) / P),
    "broadcast": ((N, 0), (N, 0), 1.0),
    "reduce": ((N, N), (N, 0), 1.0),
    "gather": ((N, N * P), (N, 0), (P - 1) / P),
    "scatter": ((N * P, N), (0, N), (P - 1) / P),
    "barrier": ((0, 0), (0, 0), 0.0),
    "send": ((N, 0), (N, 0), 1.0),
    "recv": ((0, N), (0, N), 1.0),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_buffer_sizes_and_busbw_follow_the_semantics(name):
    info = rt.collective_info(name)
    on_root, elsewhere, factor = EXPECTED[name]
    assert info.buffer_sizes(N, P, is_root=True) == on_root
    assert info.buffer_sizes(N, P, is_root=False) == (elsewhere if info.rooted else on_root)
    assert info.busbw_factor(P) == pytest.approx(factor)
    assert info.reduction == (name in ("all_reduce", "reduce_scatter", "reduce"))
    assert info.rooted == (name in ("broadcast", "reduce", "gather", "scatter"))


def test_in_place_layouts():
    layouts = {n: rt.collective_info(n).in_place for n in EXPECTED}
    assert layouts["all_reduce"] == layouts["reduce"] == "same_buffer"
    assert layouts["all_gather"] == layouts["gather"] == "input_is_output_block"
    assert layouts["reduce_scatter"] == layouts["scatter"] == "output_is_input_block"
    assert layouts["all_to_all"] == "staged_same_buffer"
    assert layouts["broadcast"] == "one_buffer"


def test_every_collective_is_described_and_unknown_names_are_refused():
    assert set(rt.collectives.COLLECTIVES) == set(rt._core.COLLECTIVE_TRAITS)
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        rt.collective_info("allreduce")


def test_error_kinds_name_their_classes_one_to_one():
    classes = [
        rt.Error,
        rt.InvalidArgument,
        rt.Timeout,
        rt.PeerFailure,
        rt.CollectiveMismatch,
        rt.Aborted,
        rt.BootstrapError,
    ]
    kinds = [c.kind for c in classes]
    assert kinds == [
        "error",
        "invalid_argument",
        "timeout",
        "peer_failure",
        "collective_mismatch",
        "aborted",
        "bootstrap",
    ]
    with pytest.raises(rt.InvalidArgument) as info:
        rt.UniqueId.parse("hello")
    assert info.value.kind == "invalid_argument"
