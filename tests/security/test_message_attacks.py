"""A peer that lies about sizes on the message connection: a header claiming 16 GiB, and more
unexpected bytes than a rank will hold. The lying rank is a real rank that writes a forged
header straight onto its own message connection (the handshake keeps strangers off it)."""

from __future__ import annotations

import os
import socket
import struct
import time

import numpy as np
import pytest
import wire
from harness import run_world

import ringtree as rt

TCP_INFO_BYTES_ACKED = 120  # offset of tcpi_bytes_acked in struct tcp_info (linux/tcp.h)


def vm_size() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def close_quietly(comm, result):
    """Closes comm (its peer may be gone by now) and returns result."""
    try:
        comm.close()
    except rt.Error:
        pass
    return result


def message_socket_to(peer_ip, marker_bytes):
    """This process's TCP connection that has carried at least `marker_bytes` to peer_ip: the
    message connection, right after a message of that size went out on it."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        fd = int(fd)
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.family != socket.AF_INET or s.type != socket.SOCK_STREAM or s.getpeername()[0] != peer_ip:
                s.close()
                continue
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if struct.unpack_from("<Q", info, TCP_INFO_BYTES_ACKED)[0] >= marker_bytes:
                found.append(s)
                continue
        except OSError:
            pass
        s.close()
    assert len(found) == 1, f"expected one connection that carried the marker, found {len(found)}"
    return found[0]


MARKER = np.arange(1 << 18, dtype=np.int32)  # 1 MiB: picks out the message connection


def inject_after_marker(comm, raw):
    """Rank 1: sends the marker, then writes `raw` on its message connection behind the
    messenger's back. Rank 0: receives the marker; returns whether it arrived whole."""
    if comm.rank == 1:
        comm.isend(MARKER, 0, tag=1).wait()
        time.sleep(0.2)  # acknowledged by rank 0's kernel
        s = message_socket_to("127.0.0.1", MARKER.nbytes)
        s.sendall(raw)
        s.close()  # the duplicate; the messenger's own descriptor stays open
        return None
    got = np.empty_like(MARKER)
    comm.irecv(got, 1, tag=1).wait()
    return bool((got == MARKER).all())


def forge_huge_header(claim):
    comm = rt.init(timeout=20.0)
    out = {}
    marker_ok = inject_after_marker(comm, wire.MSG_HEADER.pack(wire.MSG_MAGIC, wire.MSG_KIND, 7, claim))
    if comm.rank == 0:
        out["marker_ok"] = marker_ok
        before = vm_size()
        start = time.monotonic()
        try:
            comm.irecv(np.empty(4, np.int32), 1, tag=99).wait(10.0)
            out["raised"] = None
        except rt.Error as exc:
            out["raised"], out["message"] = type(exc).__name__, str(exc)
        out["seconds"] = time.monotonic() - start
        out["vm_growth"] = vm_size() - before
    return close_quietly(comm, out)


@pytest.mark.timeout(90)
def test_a_16_gib_header_fails_its_sender_at_once_without_memory():
    world = run_world(2, forge_huge_header, dict(claim=16 << 30), timeout=60)
    res = world.check_ok()[0]
    assert res["marker_ok"], res
    assert res["raised"] == "PeerFailure", res
    assert "claiming 17179869184 bytes, over RINGTREE_MAX_MESSAGE_BYTES" in res["message"], res
    assert "rank 1" in res["message"], res
    assert res["seconds"] < 5, res  # the header failed it, not the 10 s wait
    assert res["vm_growth"] < 1 << 30, res  # nothing reserved for the claim


def overfill(count, each):
    """Rank 1 sends `count` messages of `each` bytes that rank 0 has not asked for yet; rank 0
    then receives them in order."""
    comm = rt.init(timeout=20.0)
    out = {"sent": [], "received": []}
    if comm.rank == 1:
        try:
            comm.isend(np.zeros(1 << 17, np.uint8), 0, tag=0)  # over RINGTREE_MAX_MESSAGE_BYTES
        except rt.InvalidArgument as exc:
            out["too_big"] = str(exc)
        for k in range(count):
            try:
                comm.isend(np.full(each, k + 1, np.uint8), 0, tag=k + 1).wait(10.0)
                out["sent"].append(k + 1)
            except rt.Error as exc:
                out["sent"].append(type(exc).__name__)
    else:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # until rank 1's last message is here, or rank 1 is gone
            try:
                if comm.iprobe(1, count) is not None:
                    break
            except rt.PeerFailure:
                break
            time.sleep(0.02)
        for k in range(count):
            buf = np.zeros(each, np.uint8)
            try:
                comm.irecv(buf, 1, tag=k + 1).wait(5.0)
                out["received"].append(bool((buf == k + 1).all()))
            except rt.Error as exc:
                out["received"].append(type(exc).__name__)
                out["message"] = str(exc)
    return close_quietly(comm, out)


@pytest.mark.timeout(90)
def test_message_caps_refuse_a_big_send_and_drop_a_peer_past_the_unexpected_bytes():
    env = {"RINGTREE_MAX_MESSAGE_BYTES": str(1 << 16), "RINGTREE_MAX_UNEXPECTED_BYTES": "150000"}
    world = run_world(2, overfill, dict(count=3, each=60000), timeout=60, env=env)
    r0, r1 = world.check_ok()
    assert "over RINGTREE_MAX_MESSAGE_BYTES=65536" in r1["too_big"], r1
    # Two fit under the cap and are delivered whole; the third would pass it: its sender is dropped.
    assert r0["received"] == [True, True, "PeerFailure"], r0
    assert "RINGTREE_MAX_UNEXPECTED_BYTES=150000" in r0["message"], r0


def forge_tag(tag):
    """Rank 1 writes a whole message (header and 8 bytes) with `tag` on its message connection;
    rank 0 waits for any message from anyone."""
    comm = rt.init(timeout=20.0)
    out = {}
    inject_after_marker(comm, wire.MSG_HEADER.pack(wire.MSG_MAGIC, wire.MSG_KIND, tag, 8) + b"injected")
    if comm.rank == 0:
        start = time.monotonic()
        try:
            work = comm.irecv(np.empty(8, np.uint8))  # any source, any tag
            work.wait(10.0)
            out["raised"], out["got_tag"] = None, work.tag
        except rt.Error as exc:
            out["raised"], out["message"] = type(exc).__name__, str(exc)
        out["seconds"] = time.monotonic() - start
    return close_quietly(comm, out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tag", [-7, rt._core.RESERVED_TAG_END, (1 << 63) - 1])
def test_a_tag_no_send_can_produce_fails_its_sender_and_is_never_delivered(tag):
    world = run_world(2, forge_tag, dict(tag=tag), timeout=60)
    res = world.check_ok()[0]
    assert res["raised"] == "PeerFailure", res  # not a message with that tag
    assert f"tag {tag}, which no send can produce" in res["message"] and "rank 1" in res["message"], res
    assert res["seconds"] < 5, res
