"""ringtree's set-up wire, protocol 5, written again from its description (bootstrap/handshake.h,
bootstrap.cc) with Python's hmac and struct: the tests speak it byte for byte, so an attacker's
message can be right in every byte but one.

A connection: the client's hello, the server's challenge (its nonce and its proof), the client's
proof (an HMAC over the transcript and the payload, then the payload), the server's accept
(status, text and a truncated MAC). On the star the rank's payload is its peer record, and
afterwards rank 0 and the rank seal every message with a MAC under a key of the connection's own.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
from dataclasses import dataclass, field

VERSION = 5
HELLO_MAGIC, CHALLENGE_MAGIC, REFUSAL_MAGIC, TABLE_MAGIC = 0x52544231, 0x52544348, 0x52545442, 0x52545442
MSG_MAGIC, MSG_KIND = 0x52544D53, 1  # the messenger's header: magic, kind, tag, bytes
CONTROL, DATA, MESSAGE, STAR = 0, 1, 2, 3

HELLO = struct.Struct("<IIiiii16s")  # magic, version, kind, rank, size, peer, nonce
CHALLENGE = struct.Struct("<II16s32s")  # magic, version, nonce, mac
ACCEPT = struct.Struct("<iI16s")  # status, text length, mac
REFUSAL = struct.Struct("<IiiI")  # magic, status, size, text length (then the text)
TABLE_HEADER = struct.Struct("<IiiI")  # magic, status, size, text length
PEER = struct.Struct("<iHBB16s64sQQII")  # pid, mesh port, force tcp, pad, ip, host, shm/cpu domains, cpus, pad
MSG_HEADER = struct.Struct("<IIqQ")
SEAL = 16
assert (HELLO.size, CHALLENGE.size, ACCEPT.size, PEER.size) == (40, 56, 24, 112)


def secret_of(token: str) -> bytes:
    """The 16 secret bytes of a unique id token rt1:<ip>:<port>:<hex>."""
    return bytes.fromhex(str(token).rsplit(":", 1)[1])


@dataclass
class Transcript:
    kind: int
    client_rank: int
    server_rank: int
    size: int
    setup: bytes = bytes(16)
    client_nonce: bytes = bytes(16)
    server_nonce: bytes = bytes(16)

    def mac(self, key: bytes, label: str, extra: bytes = b"") -> bytes:
        msg = (
            label.encode()
            + b"\0"
            + struct.pack("<Iiiii", VERSION, self.kind, self.client_rank, self.server_rank, self.size)
            + self.setup
            + self.client_nonce
            + self.server_nonce
            + extra
        )
        return hmac.new(key, msg, "sha256").digest()

    def accept_mac(self, key: bytes, status: int, text: bytes) -> bytes:
        return self.mac(key, "ringtree accept", struct.pack("<iI", status, len(text)) + text)[:16]

    def session_key(self, key: bytes) -> bytes:
        return self.mac(key, "ringtree star session")


def seal(session_key: bytes, direction: int, count: int, data: bytes) -> bytes:
    """A sealed star message's MAC (direction 1: from rank 0, 2: to rank 0)."""
    return hmac.new(session_key, struct.pack("<BQ", direction, count) + data, "sha256").digest()[:SEAL]


def peer_record(pid=4242, mesh_port=1, ip="127.0.0.1", host="stranger", force_tcp=1) -> bytes:
    return PEER.pack(
        pid, mesh_port, force_tcp, 0, ip.encode().ljust(16, b"\0"), host.encode().ljust(64, b"\0"), 0, 0, 1, 0
    )


def recv_exact(sock, n) -> bytes:
    """n bytes, or fewer if the peer closed first."""
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    return data


@dataclass
class Outcome:
    """What a server made of one client's handshake."""

    answer: str = ""  # "challenge", "refusal", "closed" or "other"
    server_proved: bool = False
    accepted: int | None = None  # the accept's status when one came whose MAC verified
    refusal_text: str = ""
    sent: bytes = b""  # every byte the client sent
    sock: socket.socket | None = field(default=None, repr=False)  # open after an accept, else closed


def client_handshake(
    secret: bytes, addr, t: Transcript, payload: bytes = b"", flip: int | None = None, timeout: float = 5.0, keep=False
) -> Outcome:
    """Dials addr and runs the client's side as a ringtree rank would, except that with `flip`
    the byte at that offset of everything the client sends (hello, proof, payload) goes out
    with its low bit flipped. The proof is computed over the intended transcript, so a server
    that reads a flipped byte must refuse it."""
    out = Outcome()
    t.client_nonce = os.urandom(16)
    hello = HELLO.pack(HELLO_MAGIC, VERSION, t.kind, t.client_rank, t.size, t.server_rank, t.client_nonce)
    sent_so_far = 0

    def send(data: bytes):
        nonlocal sent_so_far
        if flip is not None and sent_so_far <= flip < sent_so_far + len(data):
            data = bytearray(data)
            data[flip - sent_so_far] ^= 0x01
            data = bytes(data)
        sent_so_far += len(data)
        out.sent += data
        sock.sendall(data)

    sock = socket.create_connection(addr, timeout=timeout)
    try:
        send(hello)
        head = recv_exact(sock, REFUSAL.size)
        if len(head) < 4:
            out.answer = "closed"
            return out
        magic = struct.unpack_from("<I", head)[0]
        if magic == REFUSAL_MAGIC:
            _, _, _, n = REFUSAL.unpack(head)
            out.answer, out.refusal_text = "refusal", recv_exact(sock, n).decode(errors="replace")
            return out
        if magic != CHALLENGE_MAGIC:
            out.answer = "other"
            return out
        out.answer = "challenge"
        _, _, t.server_nonce, mac = CHALLENGE.unpack(head + recv_exact(sock, CHALLENGE.size - len(head)))
        out.server_proved = hmac.compare_digest(mac, t.mac(secret, "ringtree server"))
        try:
            send(t.mac(secret, "ringtree client", payload) + payload)
        except OSError:
            return out
        reply = recv_exact(sock, ACCEPT.size)
        if len(reply) < ACCEPT.size:
            return out
        status, n, accept_mac = ACCEPT.unpack(reply)
        text = recv_exact(sock, n)
        if hmac.compare_digest(accept_mac, t.accept_mac(secret, status, text)):
            out.accepted = status
            out.refusal_text = text.decode(errors="replace")
        if keep and out.accepted == 0:
            out.sock, sock = sock, None
        return out
    finally:
        if sock is not None:
            sock.close()


def star_transcript(rank: int, size: int) -> Transcript:
    return Transcript(kind=STAR, client_rank=rank, server_rank=0, size=size)


def read_sealed(sock, session_key: bytes, count: int, n: int) -> tuple[bytes, bool]:
    """(n bytes of a message rank 0 sealed, whether its MAC is right)."""
    data = recv_exact(sock, n)
    mac = recv_exact(sock, SEAL)
    return data, len(data) == n and hmac.compare_digest(mac, seal(session_key, 1, count, data))


def read_table(sock, session_key: bytes, size: int):
    """Rank 0's table after a star handshake: (peer records, set-up id), checking both seals."""
    head, ok = read_sealed(sock, session_key, 0, TABLE_HEADER.size)
    assert ok, "the table header's seal is wrong"
    magic, status, got_size, _ = TABLE_HEADER.unpack(head)
    assert (magic, status, got_size) == (TABLE_MAGIC, 0, size), (magic, status, got_size)
    body, ok = read_sealed(sock, session_key, 1, size * PEER.size + 16)
    assert ok, "the table's seal is wrong"
    peers = [PEER.unpack_from(body, r * PEER.size) for r in range(size)]
    return peers, body[size * PEER.size :]


def serve_challenge(sock, secret: bytes, t: Transcript, flip: int | None = None) -> Transcript:
    """A server's challenge, after reading the client's hello from sock; with `flip`, the byte at
    that offset of the challenge goes out flipped. Returns the transcript (nonces filled in)."""
    hello = recv_exact(sock, HELLO.size)
    _, _, kind, rank, size, peer, nonce = HELLO.unpack(hello)
    t.kind, t.client_rank, t.size, t.server_rank, t.client_nonce = kind, rank, size, peer, nonce
    t.server_nonce = os.urandom(16)
    challenge = bytearray(CHALLENGE.pack(CHALLENGE_MAGIC, VERSION, t.server_nonce, t.mac(secret, "ringtree server")))
    if flip is not None:
        challenge[flip] ^= 0x01
    sock.sendall(bytes(challenge))
    return t
