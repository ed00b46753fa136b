"""RINGTREE_SECRET: what a job's shared secret must look like, and a fresh one.

    python -m ringtree.secret        # prints 32 random hex digits (128 bits)

A secret shared through the environment is the job's password: one recorded handshake lets an
attacker test guesses offline (each costs PBKDF2's 200000 HMACs, salted per job). Against a
human-chosen password that is a matter of hours; against 128 random bits it is hopeless. So the
secret must be at least 32 hexadecimal digits from a random source (`python -m ringtree.secret`,
`openssl rand -hex 16`, Python's `secrets.token_hex(16)`), and the checks below refuse what is
plainly not random (too short, not hex, a repeated pattern, few distinct digits). They cannot
prove randomness: a value typed by hand that passes them is still a weak secret.
"""

from __future__ import annotations

import secrets
import string

from . import _core

__all__ = ["MIN_HEX_DIGITS", "new_secret", "check_secret"]

MIN_HEX_DIGITS = 32  # 128 bits
# Of the 16 hex digits, 32 random ones show 14 on average; fewer than 8 happens with
# probability below 1e-7 (all 32 within some 7 of them: C(16,7) (7/16)^32).
_MIN_DISTINCT_DIGITS = 8
# The longest run of one digit: in 32 random digits a run of 9 comes with probability ~6e-9.
_MAX_RUN = 8

_ADVICE = (
    "RINGTREE_SECRET must carry at least 128 random bits: "
    f"{MIN_HEX_DIGITS} or more hexadecimal digits from a random source. "
    "Make one with `python -m ringtree.secret` (or `openssl rand -hex 16`) and give every rank the same value"
)


def new_secret() -> str:
    """A fresh secret: 32 hex digits (128 bits) from the operating system's random source."""
    return secrets.token_hex(MIN_HEX_DIGITS // 2)


def _why_not_random(value: str) -> str | None:
    if len(value) < MIN_HEX_DIGITS:
        return f"it is {len(value)} characters long"
    if any(c not in string.hexdigits for c in value):
        return "it is not hexadecimal"
    digits = value.lower()
    if len(set(digits)) < _MIN_DISTINCT_DIGITS:
        return f"it uses only {len(set(digits))} distinct digits"
    run = longest = 1
    for a, b in zip(digits, digits[1:]):
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    if longest > _MAX_RUN:
        return f"it repeats one digit {longest} times in a row"
    for period in range(1, len(digits) // 2 + 1):
        if all(digits[i] == digits[i - period] for i in range(period, len(digits))):
            return f"it repeats a pattern of {period} digits"
    return None


def check_secret(value: str, where: str = "RINGTREE_SECRET") -> str:
    """`value` (whitespace stripped) if it looks like 128 or more random bits in hex, else
    InvalidArgument saying why, without showing any of the value."""
    value = value.strip()
    why = _why_not_random(value)
    if why is not None:
        raise _core.InvalidArgument(f"{where} is refused ({why}; its value is not shown). {_ADVICE}.")
    return value


def main() -> None:
    print(new_secret())


if __name__ == "__main__":
    main()
