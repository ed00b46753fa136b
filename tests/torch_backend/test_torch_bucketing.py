"""ringtree.Bucketer: bucket assignment, launch order, flatten/unflatten with numpy and torch,
and a multi-rank numpy world that never imports torch (its rank body, bucketer_numpy, checks).

Nothing at the top of this module may import torch: the ranks load it to run bucketer_numpy."""

import sys

import numpy as np
import pytest
from harness import run_world

from ringtree.bucketing import Bucketer, assign_buckets

MB = 1024 * 1024


class _DoneWork:
    def wait(self, timeout=None):
        return None


class RecordingComm:
    """Stands in for a Communicator of P ranks whose peers all hold the same gradients:
    all_reduce with op="avg" leaves the buffer as it is, and the order of calls is recorded."""

    def __init__(self):
        self.calls = []

    def all_reduce(self, buffer, op="sum", async_op=False, timeout=None):
        self.calls.append((int(np.size(buffer)) if not hasattr(buffer, "numel") else buffer.numel(), op))
        return _DoneWork()


def test_buckets_fill_in_reverse_order_and_close_at_the_cap():
    # float32: 4 bytes each. Cap 100 bytes = 25 elements.
    sizes = [10, 10, 10, 30, 5, 5]
    assert assign_buckets(sizes, [4] * 6, 100) == [[5, 4, 3], [2, 1, 0]]
    # A bucket closes once it reaches the cap; a gradient larger than the cap is alone.
    assert assign_buckets([25, 1, 25], [4] * 3, 100) == [[2], [1, 0]]
    assert assign_buckets([100, 100], [4, 4], 100) == [[1], [0]]
    # A smaller first bucket starts communication sooner.
    assert assign_buckets([10] * 6, [4] * 6, 100, first_bucket_cap_bytes=40) == [[5], [4, 3, 2], [1, 0]]
    # Buckets never mix dtypes.
    assert assign_buckets([1, 1, 1, 1], [4, 4, 2, 2], 1000, dtypes=["f", "f", "h", "h"]) == [[3, 2], [1, 0]]
    assert assign_buckets([], [], 100) == []
    with pytest.raises(ValueError, match="positive"):
        assign_buckets([1], [4], 0)


def test_bucketer_default_cap_is_25_mb_like_ddp():
    bucketer = Bucketer([MB] * 13, dtypes=np.float32)  # 4 MiB each
    assert bucketer.bucket_cap_bytes == 25 * MB
    # 7 gradients of 4 MiB reach 28 MiB >= 25 MiB: buckets of 7 and 6.
    assert [len(b) for b in bucketer.assignment] == [7, 6]
    assert bucketer.assignment[0][0] == 12


def test_a_bucket_launches_when_its_last_gradient_arrives_and_in_bucket_order():
    sizes = [4, 4, 4, 4]
    bucketer = Bucketer(sizes, dtypes=np.float64, bucket_cap_mb=64 / MB)  # 64 bytes: 2 gradients a bucket
    assert bucketer.assignment == [[3, 2], [1, 0]]
    comm = RecordingComm()
    grads = [np.full(4, float(i)) for i in range(4)]
    bucketer.start_step(comm)
    bucketer.mark_ready(0, grads[0])
    bucketer.mark_ready(1, grads[1])
    assert comm.calls == []  # bucket 1 is complete, but bucket 0 must go first on every rank
    bucketer.mark_ready(3, grads[3])
    assert comm.calls == []
    bucketer.mark_ready(2, grads[2])
    assert comm.calls == [(8, "avg"), (8, "avg")]
    bucketer.finish()
    assert all(np.array_equal(g, np.full(4, float(i))) for i, g in enumerate(grads))
    with pytest.raises(RuntimeError, match="outside a step"):
        bucketer.mark_ready(0, grads[0])


def test_bucketer_rejects_double_marks_wrong_sizes_and_unfinished_steps():
    bucketer = Bucketer([3, 5], dtypes=np.float32)
    bucketer.start_step(RecordingComm())
    bucketer.mark_ready(0, np.zeros(3, np.float32))
    with pytest.raises(RuntimeError, match="already marked"):
        bucketer.mark_ready(0, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="has 4 elements, expected 5"):
        bucketer.mark_ready(1, np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match="not finished"):
        bucketer.start_step(RecordingComm())
    bucketer.finish()


def test_bucketer_flattens_and_unflattens_torch_tensors_of_any_shape():
    torch = pytest.importorskip("torch")
    shapes = [(3, 4), (5,), (2, 3, 2)]
    grads = [torch.arange(int(np.prod(s)), dtype=torch.float32).reshape(s) + 100 * i for i, s in enumerate(shapes)]
    want = [g.clone() for g in grads]
    bucketer = Bucketer([g.numel() for g in grads], dtypes=[g.dtype for g in grads])
    comm = RecordingComm()
    bucketer.start_step(comm)
    for i in (2, 0, 1):
        bucketer.mark_ready(i, grads[i])
    reduced = bucketer.finish()
    assert comm.calls == [(12 + 5 + 12, "avg")]
    assert all(torch.equal(g, w) for g, w in zip(grads, want))
    assert all(torch.equal(reduced[i], want[i].reshape(-1)) for i in range(3))


def test_a_bucket_without_any_local_gradient_takes_part_with_zeros():
    bucketer = Bucketer([2, 2], dtypes=np.float32, bucket_cap_mb=8 / MB)  # one gradient a bucket
    comm = RecordingComm()
    bucketer.start_step(comm)
    bucketer.mark_ready(1, np.ones(2, np.float32))  # gradient 0 never arrives on this rank
    bucketer.flush()
    reduced = bucketer.finish()
    assert comm.calls == [(2, "avg"), (2, "avg")]
    assert np.array_equal(reduced[0], np.zeros(2, np.float32))


def bucketer_numpy(sizes, cap_mb, order_seed, skipped=0):
    """numpy gradients, marked in a rank-dependent order: each gradient ends as the average
    of every rank's. In the last step rank 0 never marks gradient `skipped` (it counts as
    zeros there). torch must not be imported along the way."""
    import numpy as np

    import ringtree as rt
    from ringtree.bucketing import Bucketer

    comm = rt.init()
    r, P = comm.rank, comm.size
    bucketer = Bucketer(sizes, dtypes=np.float64, bucket_cap_mb=cap_mb)
    wrong, steps = [], 3
    for step in range(steps):
        missing = {skipped} if step == steps - 1 else set()
        grads = [np.full(n, float(r + 1 + step + i), dtype=np.float64) for i, n in enumerate(sizes)]
        bucketer.start_step(comm)
        for i in np.random.default_rng(order_seed + 17 * r + step).permutation(len(sizes)):
            if not (r == 0 and int(i) in missing):
                bucketer.mark_ready(int(i), grads[int(i)])
        reduced = bucketer.finish()
        for i, n in enumerate(sizes):
            want = sum(float(q + 1 + step + i) for q in range(P) if not (q == 0 and i in missing)) / P
            got = reduced[i] if (r == 0 and i in missing) else grads[i]
            if n and not np.allclose(got, want):
                wrong.append(f"step {step} grad {i}: {got[:3]} != {want}")
    comm.close()
    return {"wrong": wrong, "assignment": bucketer.assignment, "torch_imported": "torch" in sys.modules}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nranks", [2, 3])
def test_bucketer_averages_numpy_gradients_over_ranks_without_torch(nranks):
    sizes = [5, 1000, 3, 0, 70000, 12, 40000]
    world = run_world(nranks, bucketer_numpy, dict(sizes=sizes, cap_mb=0.3, order_seed=nranks, skipped=4), timeout=50)
    for rank, res in enumerate(world.check_ok()):
        assert not res["wrong"], (rank, res["wrong"])
        assert res["assignment"] == [[6], [5, 4], [3, 2, 1, 0]]
        assert not res["torch_imported"]
