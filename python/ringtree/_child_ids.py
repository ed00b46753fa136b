"""Unique ids for communicators made from another one's ranks (split, shrink, grow).

The new communicator's leader reserves a port and draws a random nonce. Only its address, port
and that nonce travel to the other members, over the parent's connections and in clear (a
"public token"): each member derives the new secret from the parent's secret and the nonce
(UniqueId.child, an HMAC), so no secret ever crosses the wire.
"""

from __future__ import annotations

import os

from . import _core

PREFIX = "rtc1"
TOKEN_BYTES = 64  # the longest public token, "rtc1:255.255.255.255:65535:" + 32 hex digits, fits


def lead(comm, ip: str = "") -> tuple[str, _core.UniqueId]:
    """The leader's side: reserves a port on `ip` (default RINGTREE_ADDR, else loopback) and
    returns (the public token for the members, the new communicator's unique id)."""
    reserved = _core.UniqueId.create(ip or "")
    nonce = os.urandom(16)
    public = f"{PREFIX}:{reserved.ip}:{reserved.port}:{nonce.hex()}"
    return public, comm._core.child_unique_id(reserved.ip, reserved.port, nonce)


def follow(comm, public: str) -> _core.UniqueId:
    """A member's side: the unique id the leader's public token stands for."""
    parts = str(public).split(":")
    if len(parts) != 4 or parts[0] != PREFIX or not parts[2].isdigit() or len(parts[3]) != 32:
        raise _core.InvalidArgument(f"{public!r} is not a public token ({PREFIX}:<ip>:<port>:<32 hex digits>)")
    try:
        nonce = bytes.fromhex(parts[3])
    except ValueError:
        raise _core.InvalidArgument(f"{public!r}: the nonce is not hex") from None
    return comm._core.child_unique_id(parts[1], int(parts[2]), nonce)
