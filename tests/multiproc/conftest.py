"""Fixtures shared by the multi-rank tests."""

import pytest

from rtbench import netns


@pytest.fixture
def namespace_hosts(request):
    """request.param emulated hosts, each a network namespace (bench/rtbench/netns.py); removed
    after the test, failed or not; the test skips, saying why, where they cannot be made."""
    try:
        with netns.emulated_hosts(request.param) as hosts:
            yield hosts
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))
