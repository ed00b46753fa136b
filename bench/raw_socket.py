#!/usr/bin/env python3
"""Raw-socket baseline for the namespace benches: the bytes a ring all_reduce moves, over plain
TCP sockets and nothing else (no header, no reduction, no progress engine).

One process per host (bench/netns_launch.py runs it inside each host's namespace). Hosts form a
ring: host h sends to host h+1 and receives from host h-1 at the same time, as every rank of a
ring all_reduce does; for a buffer of N bytes each host moves 2(P-1)/P * N bytes each way, which
is N for two hosts. One iteration is "send those bytes and receive as many"; the next starts only
after this one's bytes have all arrived (a collective's dependency), so small sizes pay the
latency a collective pays. Each host prints one JSON line: its average seconds per iteration for
every size; the launcher keeps the slowest host's, as rt_bench does.

Sockets are non-blocking and driven by one poll loop (the structure of ringtree's own progress
engine), with TCP_NODELAY and up to 4 MiB a syscall. --sockbuf sets SO_SNDBUF/SO_RCVBUF (0: the
kernel's autotuning), --streams splits each host's bytes over several connections to its
successor, --zerocopy sends with MSG_ZEROCOPY: they exist to measure what each is worth on this
link before the transport adopts it.
"""

from __future__ import annotations

import argparse
import errno
import json
import select
import socket
import sys
import time

SO_ZEROCOPY = getattr(socket, "SO_ZEROCOPY", 60)
MSG_ZEROCOPY = getattr(socket, "MSG_ZEROCOPY", 0x4000000)
MAX_CALL = 4 << 20  # bytes per send/recv call


def ring_bytes(size: int, hosts: int) -> int:
    """Bytes a ring all_reduce of `size` bytes sends (and receives) per host: 2(P-1)/P * size."""
    return size * 2 * (hosts - 1) // hosts if hosts > 1 else 0


def parse_sizes(spec: str) -> list:
    """ "4K:64M:4" -> [4096, 16384, ..., 64 MiB] (first:last:factor, K/M/G = 2^10/2^20/2^30)."""

    def num(s):
        s = s.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
        return int(float(s[:-1] if mult > 1 else s) * mult)

    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"sizes as first:last:factor (e.g. 4K:64M:4), got {spec!r}")
    first, last, factor = num(parts[0]), num(parts[1]), int(parts[2])
    if first < 1 or last < first or factor < 2:
        raise ValueError(f"sizes need 1 <= first <= last and factor >= 2, got {spec!r}")
    out = []
    while first <= last:
        out.append(first)
        first *= factor
    return out


def _tune(sock, sockbuf: int, zerocopy: bool):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sockbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
    if zerocopy:
        sock.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)


def ring_sockets(listener, successor, streams: int, sockbuf: int, zerocopy: bool, timeout: float):
    """(to successor, from predecessor): `streams` sockets each. `listener` listens already (its
    SO_RCVBUF, set before listen, passes to the accepted sockets before the handshake fixes the
    window scale); `successor` is the (address, port) of the next host's listener."""
    deadline = time.monotonic() + timeout
    out = []
    for _ in range(streams):
        while True:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            _tune(s, sockbuf, zerocopy)
            try:
                s.connect(successor)
                break
            except OSError:  # the successor is not listening yet
                s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        out.append(s)
    listener.settimeout(timeout)
    inc = []
    for _ in range(streams):
        s, _addr = listener.accept()
        _tune(s, sockbuf, False)
        inc.append(s)
    for s in out + inc:
        s.setblocking(False)
    return out, inc


def listen(addr: str, port: int, sockbuf: int, backlog: int = 16):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sockbuf:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
    server.bind((addr, port))
    server.listen(backlog)
    return server


class Exchange:
    """Sends `nbytes` split over the outgoing streams while receiving as many over the incoming."""

    def __init__(self, out, inc, zerocopy: bool, scratch_bytes: int = MAX_CALL):
        self.out, self.inc, self.zerocopy = out, inc, zerocopy
        # When the caller gives no buffers: one small buffer stays in cache on both sides.
        self.scratch = memoryview(bytearray(scratch_bytes))

    def close(self):
        for s in self.out + self.inc:
            s.close()

    def _drain_zerocopy(self):
        # Completions of zero-copy sends arrive on the error queue; the kernel keeps pinning
        # pages (and eventually refuses with ENOBUFS) until they are read.
        for s in self.out:
            while True:
                try:
                    s.recvmsg(0, 256, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break

    def run(self, nbytes: int, src=None, dst=None):
        """src/dst: byte memoryviews the payload comes from and lands in (reused cyclically)."""
        src = self.scratch if src is None or not len(src) else src
        dst = self.scratch if dst is None or not len(dst) else dst
        k = len(self.out)
        share = [nbytes // k + (1 if i < nbytes % k else 0) for i in range(k)]
        to_send, to_recv = list(share), list(share)
        s_off, d_off = [0] * k, [0] * k
        flags = MSG_ZEROCOPY if self.zerocopy else 0
        while any(to_send) or any(to_recv):
            moved = False
            for i, s in enumerate(self.out):
                while to_send[i]:
                    a = s_off[i] % len(src)
                    try:
                        n = s.send(src[a : a + min(MAX_CALL, to_send[i], len(src) - a)], flags)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno != errno.ENOBUFS:
                            raise
                        self._drain_zerocopy()
                        break
                    to_send[i] -= n
                    s_off[i] += n
                    moved = True
            for i, s in enumerate(self.inc):
                while to_recv[i]:
                    a = d_off[i] % len(dst)
                    try:
                        n = s.recv_into(dst[a : a + min(MAX_CALL, to_recv[i], len(dst) - a)])
                    except BlockingIOError:
                        break
                    if n == 0:
                        raise ConnectionError("the predecessor closed the connection")
                    to_recv[i] -= n
                    d_off[i] += n
                    moved = True
            if self.zerocopy:
                self._drain_zerocopy()
            if not moved:
                p = select.poll()
                for i, s in enumerate(self.out):
                    if to_send[i]:
                        p.register(s, select.POLLOUT)
                for i, s in enumerate(self.inc):
                    if to_recv[i]:
                        p.register(s, select.POLLIN)
                p.poll(10_000)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/raw_socket.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", type=int, required=True)
    p.add_argument("--addrs", required=True, help="comma list, one address per host")
    p.add_argument("--port", type=int, default=29631)
    p.add_argument("--sizes", default="4K:64M:4", help="first:last:factor of the all_reduce buffer")
    p.add_argument("-n", "--iters", type=int, default=10)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("--sockbuf", type=int, default=0, help="SO_SNDBUF/SO_RCVBUF bytes, 0: kernel autotuning")
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--zerocopy", action="store_true")
    p.add_argument("--buf", type=int, default=MAX_CALL, help="bytes of the buffer sent from and received into")
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args(argv)
    addrs = a.addrs.split(",")
    if not 0 <= a.host < len(addrs) or len(addrs) < 2:
        p.error("need at least two hosts and 0 <= --host < hosts")
    if a.streams < 1 or a.sockbuf < 0:
        p.error("--streams >= 1 and --sockbuf >= 0")
    sizes = parse_sizes(a.sizes)
    server = listen(addrs[a.host], a.port, a.sockbuf)
    out, inc = ring_sockets(
        server, (addrs[(a.host + 1) % len(addrs)], a.port), a.streams, a.sockbuf, a.zerocopy, a.timeout
    )
    server.close()
    ex = Exchange(out, inc, a.zerocopy, a.buf)
    result = {
        "host": a.host,
        "hosts": len(addrs),
        "streams": a.streams,
        "sockbuf": a.sockbuf,
        "zerocopy": a.zerocopy,
        "seconds": {},
    }
    for size in sizes:
        nbytes = ring_bytes(size, len(addrs))
        ex.run(1)  # a token round the ring: every host has finished the previous size
        for _ in range(a.warmup):
            ex.run(nbytes)
        t0 = time.perf_counter()
        for _ in range(a.iters):
            ex.run(nbytes)
        result["seconds"][str(size)] = (time.perf_counter() - t0) / a.iters
    ex.run(1)
    print(json.dumps(result), flush=True)
    ex.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
