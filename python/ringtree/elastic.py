"""Shrink and grow: carry on after a lost rank without relaunching.

shrink: the survivors agree on who is alive over the old communicator's tagged messages (which
keep working after a collective failed) and build a communicator of their own. Terms:
  view     the set of old ranks a rank believes alive and willing (all minus `exclude`, minus
           the ranks it has seen die or fall silent); it only ever shrinks;
  round    every rank sends its view to every old rank not known dead, then receives the view
           of every rank in its own view (a peer that dies or stays silent for `timeout` leaves
           the view), and intersects them all; a view that leaves this rank out excludes it;
  stable   a round in which every view received equals this rank's own;
  leader   the lowest rank of a view; once its round is stable it sends a commit (the final
           set and a fresh unique id) to every old rank not known dead, instead of its next view.
The others keep exchanging rounds until a commit arrives (they look for one from any rank
before and during every wait), so a member that dropped a rank the leader still saw follows
the leader's set: one decision, one set. A rank the commit leaves out, or whose peers' views
leave it out, raises Excluded; so a rank that was only slow (stopped, then resumed) finds the
views and the commit waiting in its message queue and raises, rather than forming a second
communicator of its own. Members then build the new communicator (densely renumbered in old
rank order, the leader is rank 0) and close the old one.

grow: the members agree on a unique id (rank 0 makes it and hands it to publish(), which gets
it to the new processes); the new processes call join(token); everyone builds the new
communicator, old ranks first with their numbers, new ranks after them.

The unique ids of shrink's and grow's communicators never cross the old connections whole:
only a public token (address, port, nonce) does, and the members derive the secret from the
old communicator's (_child_ids).
"""

from __future__ import annotations

import time

import numpy as np

from . import _child_ids, _core, _settings
from ._args import RESERVED_TAGS, rank_arg, timeout_arg

__all__ = ["Excluded", "shrink", "grow", "grow_token_place"]

# Shrink's messages travel on RESERVED_TAGS and above (user messages are refused there, see
# Communicator.isend; the messenger's any-tag never matches them). One shrink attempt's tags:
# its commit tag, then a view tag per round. A shrink whose new communicator failed to form (on
# every member: set-up ends everywhere or nowhere) may be retried on the old one; the retry's
# messages must not meet the failed attempt's leftovers.
_ATTEMPT_SPAN = 1 << 32
_VIEW, _COMMIT = 1, 2
_TOKEN_BYTES = 64
_GROW_PREFIX = "rtgrow1"
# After a round's deadline, one short look more: a rank resumed after SIGSTOP has its peers'
# messages in its socket buffers, and its progress thread needs a moment to read them.
_GRACE_S = 0.2


class Excluded(_core.Error):
    """This rank is not a member of the communicator that shrink() formed: the other ranks
    gave up on it (it was excluded on purpose, or stopped answering in time)."""

    kind = "excluded"
    __module__ = "ringtree"


def _message(size: int, kind: int, round_: int, members, token: str = "") -> np.ndarray:
    """kind and round (two int64), one byte per old rank (1: member), a token (commits)."""
    buf = np.zeros(16 + size + _TOKEN_BYTES, np.uint8)
    buf[:16].view(np.int64)[:] = (kind, round_)
    buf[16 + np.fromiter(members, np.int64, len(members))] = 1
    raw = token.encode()
    buf[16 + size : 16 + size + len(raw)] = np.frombuffer(raw, np.uint8)
    return buf


def _parse(buf: np.ndarray, size: int):
    kind, round_ = (int(v) for v in buf[:16].view(np.int64))
    members = frozenset(int(q) for q in np.flatnonzero(buf[16 : 16 + size]))
    token = buf[16 + size :].tobytes().rstrip(b"\0").decode()
    return kind, round_, members, token


def _rendezvous_ip(comm) -> str:
    """Where this rank listens when it leads a new rendezvous: RINGTREE_ADDR if set, else the
    address its peers already reach it at (loopback would strand peers on other hosts or in
    other network namespaces)."""
    return _settings.given("RINGTREE_ADDR") or comm._core.address()


def _send(comm, buf, dst, tag):
    return comm._isend(buf, dst, tag, "shrink")


def _recv(comm, buf, src, tag):
    return comm._irecv(buf, src, tag, "shrink")


def _attempt_tags(comm):
    """(commit tag, first view tag) of a new shrink attempt on comm."""
    attempt = comm._shrink_attempts
    base = RESERVED_TAGS + attempt * _ATTEMPT_SPAN
    if base + _ATTEMPT_SPAN > _core.RESERVED_TAG_END:  # the messenger refuses tags past it
        raise _core.Error(f"shrink: {attempt} attempts on this communicator already; no tags are left for another")
    comm._shrink_attempts = attempt + 1
    return base, base + 1


def _take_commit(comm, size, commit_tag):
    """A commit some leader sent this rank, if one has arrived: (members, token), else None."""
    try:
        found = comm._core.iprobe(-1, commit_tag)
    except _core.Error:  # every other rank is gone: no commit can come
        return None
    if found is None:
        return None
    buf = np.zeros(16 + size + _TOKEN_BYTES, np.uint8)
    _recv(comm, buf, found[0], commit_tag).wait(1.0)
    _, _, members, token = _parse(buf, size)
    return members, token


def _gather_views(comm, senders, round_, deadline, tags):
    """Receive round `round_`'s view from every rank in `senders` until the deadline.
    Returns (views, dead, silent, commit): views by rank, the ranks whose connection failed,
    the ranks that sent nothing in time, and a commit if one arrived (then the rest is moot)."""
    size = comm.size
    bufs = {q: np.zeros(16 + size + _TOKEN_BYTES, np.uint8) for q in senders}
    commit_tag, view_tag = tags
    works = {q: _recv(comm, bufs[q], q, view_tag + round_) for q in senders}
    views, dead, pending = {}, set(), set(senders)
    nap, graced = 0.0005, False
    while True:
        commit = _take_commit(comm, size, commit_tag)
        if commit is not None:
            for q in pending:
                works[q].cancel()
            return views, dead, set(), commit
        for q in list(pending):
            if works[q].is_completed():
                pending.discard(q)
                try:
                    works[q].wait(1.0)
                    views[q] = _parse(bufs[q], size)[2]
                except (_core.PeerFailure, _core.Aborted):
                    dead.add(q)
        if not pending:
            return views, dead, set(), None
        if time.monotonic() >= deadline:
            if not graced:
                graced, deadline = True, time.monotonic() + _GRACE_S
                continue
            for q in pending:
                works[q].cancel()
            return views, dead, pending, None
        time.sleep(nap)  # not a hot path: a few rounds per failure
        nap = min(2 * nap, 0.01)


def _send_commit(comm, round_, members, token, dead, commit_tag, timeout):
    note = _message(comm.size, _COMMIT, round_, members, str(token))
    sent = [_send(comm, note, q, commit_tag) for q in range(comm.size) if q != comm.rank and q not in dead]
    for work in sent:  # out before the old communicator closes (a dead peer's fails)
        try:
            work.wait(timeout)
        except _core.Error:
            pass


def _validate_exclude(comm, exclude):
    try:
        ranks = {int(q) for q in exclude}
    except (TypeError, ValueError):
        raise _core.InvalidArgument(f"shrink: exclude must be a collection of ranks, got {exclude!r}") from None
    bad = sorted(q for q in ranks if not 0 <= q < comm.size)
    if bad:
        raise _core.InvalidArgument(f"shrink: exclude names ranks {bad} outside 0..{comm.size - 1}")
    if comm.rank in ranks:
        raise _core.InvalidArgument(
            f"shrink: rank {comm.rank} cannot exclude itself; a rank that leaves calls close() instead of shrink()"
        )
    return ranks


def shrink(comm, exclude=(), timeout=None):
    """See Communicator.shrink. The new communicator is of comm's own class."""
    exclude = _validate_exclude(comm, exclude)
    timeout = timeout_arg(comm.timeout, timeout, "shrink")
    size, me = comm.size, comm.rank
    view = frozenset(range(size)) - exclude
    dead = set()
    commit = None
    tags = commit_tag, view_tag = _attempt_tags(comm)
    for round_ in range(2 * size + 2):  # every unstable round shrinks some rank's view
        stable = False
        if min(view) == me:  # leader: a stable round ends the exchange
            commit = _take_commit(comm, size, commit_tag)
        if commit is None:
            note = _message(size, _VIEW, round_, view)
            for q in range(size):
                if q != me and q not in dead:
                    _send(comm, note, q, view_tag + round_)
            views, died, silent, commit = _gather_views(
                comm, sorted(view - {me}), round_, time.monotonic() + timeout, tags
            )
            dead |= died
            for q, theirs in views.items():
                if me not in theirs:
                    raise Excluded(
                        f"shrink: rank {me} is excluded: rank {q}'s view of the survivors "
                        f"is {sorted(theirs)} (round {round_})"
                    )
            stable = not died and not silent and all(theirs == view for theirs in views.values())
            for theirs in views.values():
                view &= theirs
            view -= died | silent
        if commit is None and stable and min(view) == me:
            token = _child_ids.lead(comm, _rendezvous_ip(comm))[0]  # public: members derive the secret
            _send_commit(comm, round_, view, token, dead, commit_tag, timeout)
            commit = (view, token)
        elif commit is not None:
            # Pass the leader's commit on before acting on it: a leader that dies while sending
            # it must not leave some members setting up and others still exchanging views. With
            # the relay every member sets up from the same commit, so all of them succeed or all
            # fail (set-up ends everywhere or nowhere) and may shrink again together.
            _send_commit(comm, round_, commit[0], commit[1], dead, commit_tag, timeout)
        if commit is not None:
            break
    else:
        raise _core.Error(f"shrink: rank {me} did not converge in {2 * size + 2} rounds (its view: {sorted(view)})")
    members, token = commit
    if me not in members:
        raise Excluded(
            f"shrink: rank {me} is excluded: the survivors formed a communicator of old ranks "
            f"{sorted(members)} without it"
        )
    order = sorted(members)
    new = type(comm)(order.index(me), len(order), _child_ids.follow(comm, token), timeout)
    comm.close()
    return new


def grow(comm, joiners, publish=None, timeout=None):
    """See Communicator.grow. The new communicator is of comm's own class."""
    joiners = rank_arg(joiners, "grow: joiners")
    if joiners < 1:
        raise _core.InvalidArgument(f"grow: joiners must be at least 1, got {joiners}")
    if comm.rank == 0 and not callable(publish):
        raise _core.InvalidArgument(
            f"grow: rank 0 needs publish, a callable that hands the token to the new processes; got {publish!r}"
        )
    timeout = timeout_arg(comm.timeout, timeout, "grow")
    new_size = comm.size + joiners
    raw = np.zeros(_TOKEN_BYTES, np.uint8)
    failure = None
    if comm.rank == 0:
        # The members get the public token and derive the secret; the joiners, who hold no
        # parent secret, get the whole unique id through publish (a channel the caller trusts).
        public, uid = _child_ids.lead(comm, _rendezvous_ip(comm))
        try:
            publish(f"{_GROW_PREFIX}:{comm.size}:{new_size}:{uid}")
            raw[: len(public)] = np.frombuffer(public.encode(), np.uint8)
        except Exception as exc:  # noqa: BLE001 - told to the members (an empty token), then raised
            failure = exc
    comm.broadcast(raw, root=0, timeout=timeout)  # an empty token: rank 0's publish failed
    if failure is not None:
        raise failure
    public = raw.tobytes().rstrip(b"\0").decode()
    if not public:
        raise _core.Error("grow: rank 0's publish callback raised; no communicator was formed")
    return type(comm)(comm.rank, new_size, _child_ids.follow(comm, public), timeout)


def grow_token_place(token: str, index: int) -> tuple:
    """(rank, size, unique id) of new process `index` in the communicator a grow token names
    (ringtree.join builds it)."""
    parts = str(token).split(":", 3)
    if len(parts) != 4 or parts[0] != _GROW_PREFIX or not parts[1].isdigit() or not parts[2].isdigit():
        # Not echoed: a grow token carries the new communicator's secret.
        raise _core.InvalidArgument(
            f"join: the token ({len(str(token))} characters, not shown: it may hold a secret) is not a grow "
            f"token ({_GROW_PREFIX}:<old size>:<new size>:<id>)"
        )
    old, new = int(parts[1]), int(parts[2])
    index = rank_arg(index, "join: index")
    if not 0 <= index < new - old:
        raise _core.InvalidArgument(f"join: index {index} is outside 0..{new - old - 1} ({new - old} joiners)")
    return old + index, new, parts[3]
