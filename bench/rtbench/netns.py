"""Emulated hosts on one machine: each host is a network namespace (its own loopback, addresses
and abstract sockets, so the kernel and ringtree see separate machines), and the hosts are
joined through a bridge in a switch namespace of their own, one veth link per host. Ranks in one
namespace share memory (they are one host); ranks in different ones talk over TCP. The links can
be capped with `tc tbf` (netem is not in this machine's kernel). Every namespace, link and
address is made here, inside namespaces made here, and all are removed on exit, failure included;
namespaces left by a process that was killed before it could clean up are removed by the next
run. Needs root and iproute2's `ip` and `tc`; without them NetnsUnavailable says why."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass

NET = "10.251.0.{}"  # host h is .h+1; the addresses exist only inside the namespaces made here
PREFIX = "rth"  # rth<pid>-<tag>-<role>: the pid that made it, so leftovers can be found


class NetnsUnavailable(RuntimeError):
    """This machine cannot make the namespaces; the message says why."""


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def tc(*args, check=True):
    return subprocess.run(["tc", *args], capture_output=True, text=True, timeout=20, check=check)


def rate_bytes_per_second(rate: str) -> float:
    """tc's rate syntax ("2gbit", "500mbit", "100mbps" is bytes) in bytes per second."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps)", rate.strip().lower())
    if not m:
        raise ValueError(f"a rate like 2gbit or 500mbit, got {rate!r}")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale / (8 if m.group(3) == "bit" else 1)


@dataclass
class Hosts:
    """Namespaces made by emulated_hosts(); host h's namespace is names[h], its address addrs[h]
    on its link `device` (the same name in every host namespace)."""

    names: list
    addrs: list
    switch: str
    device: str = "eth0"
    rate: str = None

    def prefix(self, host: int) -> list:
        """Words that run a command on host `host` (run_world's per_rank_prefix)."""
        return ["ip", "netns", "exec", self.names[host]]

    def cut(self, host: int):
        """Takes host `host`'s link down, as when its cable or switch port fails."""
        ip("-n", self.names[host], "link", "set", self.device, "down")

    def describe(self) -> str:
        cap = f", links capped at {self.rate} (tc tbf)" if self.rate else ", links uncapped"
        return (
            f"{len(self.names)} namespace hosts ({', '.join(f'{n}={a}' for n, a in zip(self.names, self.addrs))})"
            f" on bridge {self.switch}{cap}"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_leftovers():
    """Deletes namespaces a killed earlier run of this module made (its pid is gone)."""
    listing = ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\S+)", listing, re.M):
        if not _alive(int(name[1])):
            ip("netns", "del", name[0], check=False)


def _cap(namespace: str, device: str, rate: str):
    # The bucket must hold at least one GSO burst (veth offloads up to 64 KiB a packet), else tbf
    # drops it outright; 2 ms of the rate beyond that keeps short bursts near the rate.
    burst = max(128 << 10, int(rate_bytes_per_second(rate) * 0.002))
    tc(
        "-n",
        namespace,
        "qdisc",
        "add",
        "dev",
        device,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        str(burst),
        "latency",
        "50ms",
    )


@contextlib.contextmanager
def emulated_hosts(hosts: int, rate: str = None):
    """Yields Hosts: `hosts` namespaces, each linked to one bridge; with `rate` (tc syntax, e.g.
    "2gbit") both directions of every host's link are capped at it. Removes all of it on exit."""
    if not 1 <= hosts <= 200:
        raise ValueError(f"1 to 200 hosts, got {hosts}")
    if rate is not None:
        rate_bytes_per_second(rate)  # a bad rate fails here, before anything is made
    if os.geteuid() != 0 or shutil.which("ip") is None or (rate and shutil.which("tc") is None):
        raise NetnsUnavailable("network namespaces need root and iproute2's `ip` (and `tc` for a rate cap)")
    remove_leftovers()
    tag = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
    made = Hosts(
        names=[f"{tag}-h{h}" for h in range(hosts)],
        addrs=[NET.format(h + 1) for h in range(hosts)],
        switch=f"{tag}-sw",
        rate=rate,
    )
    try:
        ip("netns", "add", made.switch)
        ip("-n", made.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", made.switch, "link", "set", "br0", "up")
        for h, (name, addr) in enumerate(zip(made.names, made.addrs)):
            ip("netns", "add", name)
            port = f"port{h}"  # the switch's end; the host's end is made straight in the host
            ip("-n", made.switch, "link", "add", port, "type", "veth", "peer", "name", made.device, "netns", name)
            ip("-n", made.switch, "link", "set", port, "master", "br0")
            ip("-n", made.switch, "link", "set", port, "up")
            ip("-n", name, "addr", "add", f"{addr}/24", "dev", made.device)
            ip("-n", name, "link", "set", made.device, "up")
            ip("-n", name, "link", "set", "lo", "up")
            if rate:
                _cap(name, made.device, rate)
                _cap(made.switch, port, rate)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        _remove(made)
        raise NetnsUnavailable(f"cannot make network namespaces here: {getattr(exc, 'stderr', None) or exc}") from None
    try:
        yield made
    finally:
        _remove(made)


def _remove(made: Hosts):
    # Deleting a namespace deletes the links in it, and with them their peers and qdiscs.
    for name in [*made.names, made.switch]:
        ip("netns", "del", name, check=False)


@contextlib.contextmanager
def two_namespaces():
    """Yields (names, addresses) of two fresh namespace hosts; removes them afterwards."""
    with emulated_hosts(2) as made:
        yield made.names, made.addrs


def rank_placement(ranks_per_host):
    """host of each rank, contiguous: rank_placement([2, 2]) == [0, 0, 1, 1]."""
    return [h for h, n in enumerate(ranks_per_host) for _ in range(n)]
