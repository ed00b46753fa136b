"""The set-up's own SHA-256, HMAC-SHA256 and PBKDF2-HMAC-SHA256 (csrc/bootstrap/crypto.cc)
against published test vectors and against Python's hashlib and hmac on random inputs, and the
unique ids derived with them (a seeded secret, a child communicator's secret)."""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import struct

import pytest

import ringtree as rt
from ringtree import _core

# FIPS 180-4 examples (NIST's "SHA256.pdf" and the 448- and 896-bit messages).
SHA256_VECTORS = [
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (
        b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    ),
    (
        b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
    ),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]

# RFC 4231, test cases 1, 2, 3, 4, 6 and 7 (5 truncates its output).
HMAC_VECTORS = [
    (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (
        b"\xaa" * 131,
        b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
    ),
    (
        b"\xaa" * 131,
        b"This is a test using a larger than block-size key and a larger than block-size data. "
        b"The key needs to be hashed before being used by the HMAC algorithm.",
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
    ),
]

# RFC 7914 section 11 (PBKDF2-HMAC-SHA256).
PBKDF2_VECTORS = [
    (
        b"passwd",
        b"salt",
        1,
        64,
        "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
        "49ca9cccf179b645991664b39d77ef317c71b845b1e30bd509112041d3a19783",
    ),
    (
        b"Password",
        b"NaCl",
        80000,
        64,
        "4ddcd8f60b98be21830cee5ef22701f9641a4418d04c0414aeff08876b34ab56"
        "a1d425a1225833549adb841b51c9b3176a272bdebba1d078478f62b397f33c8d",
    ),
]


@pytest.mark.parametrize("message,digest", SHA256_VECTORS, ids=lambda v: str(len(v)) if isinstance(v, bytes) else "")
def test_sha256_matches_the_published_vectors(message, digest):
    assert _core._sha256(message).hex() == digest


def test_sha256_matches_hashlib_across_block_boundaries():
    rng = random.Random(1)
    # Every length around the 55/56/64-byte padding edges, then random ones.
    lengths = list(range(0, 200)) + [rng.randrange(200, 10_000) for _ in range(50)]
    for n in lengths:
        data = rng.randbytes(n)
        assert _core._sha256(data) == hashlib.sha256(data).digest(), n


@pytest.mark.parametrize("key,message,mac", HMAC_VECTORS, ids=[f"rfc4231-{i}" for i in (1, 2, 3, 4, 6, 7)])
def test_hmac_matches_rfc4231(key, message, mac):
    assert _core._hmac_sha256(key, message).hex() == mac


def test_hmac_matches_python_for_random_keys_and_messages():
    rng = random.Random(2)
    for _ in range(400):
        key = rng.randbytes(rng.choice([0, 1, 16, 32, 63, 64, 65, 100, 200]))
        msg = rng.randbytes(rng.randrange(0, 300))
        assert _core._hmac_sha256(key, msg) == hmac.new(key, msg, "sha256").digest(), (len(key), len(msg))


@pytest.mark.parametrize("password,salt,iterations,length,key", PBKDF2_VECTORS, ids=["1-iteration", "80000-iterations"])
def test_pbkdf2_matches_rfc7914(password, salt, iterations, length, key):
    assert _core._pbkdf2_sha256(password, salt, iterations, length).hex() == key


def test_pbkdf2_matches_hashlib_for_random_inputs():
    rng = random.Random(3)
    for _ in range(40):
        password, salt = rng.randbytes(rng.randrange(0, 90)), rng.randbytes(rng.randrange(0, 40))
        iterations, length = rng.randrange(1, 300), rng.randrange(1, 100)  # more than one 32-byte block too
        assert _core._pbkdf2_sha256(password, salt, iterations, length) == hashlib.pbkdf2_hmac(
            "sha256", password, salt, iterations, length
        ), (iterations, length)
    with pytest.raises(rt.InvalidArgument, match="iterations"):
        _core._pbkdf2_sha256(b"x", b"y", 0, 16)


def secret_of(uid) -> bytes:
    return bytes.fromhex(str(uid).rsplit(":", 1)[1])


def test_a_seeded_secret_is_pbkdf2_with_200000_iterations_salted_with_the_port_and_the_jobs_salt():
    seed = "correct horse battery staple"
    uid = rt.UniqueId.from_seed("127.0.0.1", 29411, seed, "job-7")
    salt = b"ringtree seeded unique id v2|29411|job-7"
    expected = hashlib.pbkdf2_hmac("sha256", seed.encode(), salt, 200_000, 32)[:16]
    assert secret_of(uid) == expected
    assert (uid.ip, uid.port) == ("127.0.0.1", 29411)
    # Another port or another job's salt, another secret: one dictionary of stretched guesses
    # does not fit two jobs.
    assert secret_of(rt.UniqueId.from_seed("127.0.0.1", 29412, seed, "job-7")) != expected
    assert secret_of(rt.UniqueId.from_seed("127.0.0.1", 29411, seed, "job-8")) != expected
    with pytest.raises(rt.InvalidArgument, match="seed is empty"):
        rt.UniqueId.from_seed("127.0.0.1", 29411, "")


def test_a_child_secret_is_an_hmac_of_the_parent_secret_over_the_public_nonce():
    parent = rt.UniqueId.create()
    os.close(parent.take_listener())
    nonce = bytes(range(16))
    label = b"ringtree child unique id v1\0"
    want = hmac.new(secret_of(parent), label + nonce + struct.pack("<H", 4321) + b"127.0.0.1", "sha256").digest()[:16]
    comm = rt.init(0, 1, parent)
    try:
        child = comm._core.child_unique_id("127.0.0.1", 4321, nonce)
        assert secret_of(child) == want
        assert (child.ip, child.port) == ("127.0.0.1", 4321)
        assert secret_of(comm._core.child_unique_id("127.0.0.1", 4321, bytes(16))) != want
        with pytest.raises(rt.InvalidArgument, match="16 bytes"):
            comm._core.child_unique_id("127.0.0.1", 4321, b"short")
    finally:
        comm.close()
