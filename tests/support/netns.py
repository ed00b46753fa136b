"""Two network namespaces joined by a veth pair, for ranks that must look like two hosts to the
kernel (no shared loopback, no shared abstract sockets) while sharing this machine. Needs root and
iproute2's `ip`; without them `two_namespaces()` raises NetnsUnavailable saying why."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid

NET = "10.251.{}.{}"  # addresses only on the link made here, inside its own namespaces


class NetnsUnavailable(RuntimeError):
    """This machine cannot make the namespaces; the message says why."""


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


@contextlib.contextmanager
def two_namespaces():
    """Yields (names, addresses) of two fresh namespaces; removes them afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NetnsUnavailable("network namespaces need root and iproute2's `ip`")
    tag = uuid.uuid4().hex[:6]
    names = [f"rt-{tag}-a", f"rt-{tag}-b"]
    subnet = int(tag[:2], 16) % 200 + 20
    addrs = [NET.format(subnet, 1), NET.format(subnet, 2)]
    try:
        for n in names:
            ip("netns", "add", n)
        ip("link", "add", f"rt{tag}a", "type", "veth", "peer", "name", f"rt{tag}b")
        for n, dev, a in zip(names, (f"rt{tag}a", f"rt{tag}b"), addrs):
            ip("link", "set", dev, "netns", n)
            ip("-n", n, "addr", "add", f"{a}/24", "dev", dev)
            ip("-n", n, "link", "set", dev, "up")
            ip("-n", n, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as exc:
        for n in names:
            ip("netns", "del", n, check=False)
        raise NetnsUnavailable(f"cannot make network namespaces here: {getattr(exc, 'stderr', exc)}") from None
    try:
        yield names, addrs
    finally:
        for n in names:
            ip("netns", "del", n, check=False)
