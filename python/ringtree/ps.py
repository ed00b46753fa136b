"""A parameter server over ringtree's tagged messages.

One script, run on every rank::

    tables = [ps.Table("emb", dim=16, init_scale=0.01, optimizer=ps.Adam(lr=1e-2)),
              ps.Table("bias", dim=1, rows=1)]
    node = ps.start(comm, tables, num_servers=2, mode="ssp", staleness=2)
    if node.is_server:
        report = node.serve()            # returns once every worker finished or died
    else:
        rows = node.pull("emb", keys)    # [len(keys), 16] float32
        node.push("emb", keys, grads)    # applied on the servers by their optimizer
        node.finish()

Ranks 0..num_servers-1 are servers, the rest workers. A table's rows are sharded by key over the
servers (key k lives on server k % num_servers). Dense tables (`rows` given) hold keys 0..rows-1
from the start; sparse tables (`rows=None`) create a row the first time any worker touches its
key, with a value that depends only on the table's seed and the key (so it is the same whatever
the number of servers). Only the rows a worker names travel.

Modes, per table:

- sync: a step's update is applied once every live worker pushed that step (the mean of their
  gradients); a worker's pull for step t waits until the t previous steps are applied.
- async: each push is applied on arrival; pulls never wait.
- ssp: bounded staleness s: pushes are applied on arrival, and a worker's pull waits while it is
  more than s pushes ahead of the slowest live worker.

Every pull reports the version (updates applied) of the rows it read; `node.version(table)`.

Failure: a worker that dies (its process ends without `finish`) stops counting: sync steps
complete with the remaining workers and ssp no longer waits for it. A worker whose server dies
gets ringtree.PeerFailure from the next call that needs that server. Bad input (unknown table,
wrong row width, gradients that are not float32, negative or out-of-range keys) raises ValueError
before any traffic.

The transport is ringtree's tagged point-to-point messages (Communicator.isend/irecv/probe),
so a server answers whichever worker speaks first and workers never line up in call order.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from . import _core
from ._args import ANY_SOURCE

# Tags of the protocol; a program may use other tags on the same communicator.
TAG_REQUEST = 0x7073_0001  # worker -> server: pull, push, bye
TAG_REPLY = 0x7073_0002  # server -> worker: pull answers

_PULL, _PUSH, _BYE = 1, 2, 3
_HEADER = 5  # int64 words: op, table, clock, number of keys, flags
_COMBINED = 1  # flags: the push's keys are unique

MODES = ("sync", "async", "ssp")


@dataclass(frozen=True)
class SGD:
    """Plain SGD per row: row -= lr x gradient.

    Parameters
    ----------
    lr : float
        The learning rate.
    """

    lr: float = 0.1
    """The learning rate."""


@dataclass(frozen=True)
class Adam:
    """Adam per row; a sparse row's step count advances only when it gets a gradient (lazy Adam).

    Parameters
    ----------
    lr, beta1, beta2, eps : float
        The attribute of that name.
    """

    lr: float = 1e-3
    """The learning rate."""
    beta1: float = 0.9
    """Decay of the first-moment (mean) estimate."""
    beta2: float = 0.999
    """Decay of the second-moment (uncentred variance) estimate."""
    eps: float = 1e-8
    """Added to the square root of the second moment, against division by zero."""


@dataclass(frozen=True)
class Table:
    """A table of float32 rows that the servers hold and the workers pull and push.

    Parameters
    ----------
    name : str
        Names the table in pull and push; not empty, unique among the tables.
    dim : int
        Columns per row, at least 1.
    rows : int or None
        A dense table's number of rows (keys 0..rows-1); None: a sparse table.
    init_scale : float
        Initial values are uniform in [-init_scale, init_scale] (0: zeros).
    optimizer : SGD or Adam
        How the servers apply pushed gradients.
    seed : int
        Seeds the initial values.

    Raises
    ------
    ValueError
        An empty name, dim or rows below 1, or an optimizer other than SGD or Adam.
    """

    name: str
    """Names the table in pull and push."""
    dim: int
    """Columns per row."""
    rows: int | None = None  # None: sparse, rows made on first touch
    """A dense table's number of rows; None for a sparse table, whose rows are made on first touch."""
    init_scale: float = 0.0  # initial values uniform in [-init_scale, init_scale]
    """Initial values are uniform in [-init_scale, init_scale]."""
    optimizer: SGD | Adam = field(default_factory=SGD)
    """How the servers apply pushed gradients."""
    seed: int = 0
    """Seeds the initial values (the same whatever the number of servers)."""

    def __post_init__(self):
        if not self.name:
            raise ValueError("ps.Table: a table needs a name")
        if int(self.dim) < 1:
            raise ValueError(f"ps.Table {self.name!r}: dim must be at least 1, got {self.dim}")
        if self.rows is not None and int(self.rows) < 1:
            raise ValueError(f"ps.Table {self.name!r}: rows must be at least 1 (or None for a sparse table)")
        if not isinstance(self.optimizer, (SGD, Adam)):
            raise ValueError(f"ps.Table {self.name!r}: optimizer must be ps.SGD or ps.Adam")

    @property
    def sparse(self) -> bool:
        """Whether rows are made on first touch (rows is None)."""
        return self.rows is None


def initial_rows(table: Table, keys: np.ndarray) -> np.ndarray:
    """The first value of each key's row: a hash of (seed, key, column), uniform in
    [-init_scale, init_scale]; independent of which server holds the row.

    Parameters
    ----------
    table : Table
        The table.
    keys : np.ndarray
        The rows' keys, non-negative integers.

    Returns
    -------
    np.ndarray
        [len(keys), dim] float32.
    """
    if table.init_scale == 0:
        return np.zeros((len(keys), table.dim), np.float32)
    cols = np.arange(table.dim, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (
            keys.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
            + cols[None, :] * np.uint64(0xBF58476D1CE4E5B9)
            + np.uint64(table.seed) * np.uint64(0x94D049BB133111EB)
        )
        # splitmix64's finalizer
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    unit = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return ((2 * unit - 1) * table.init_scale).astype(np.float32)


def start(comm, tables, num_servers: int = 1, mode: str = "async", staleness: int = 0):
    """This rank's part of the parameter server: a Server on ranks below num_servers, a Worker
    on the others. Every rank must pass the same tables, num_servers, mode and staleness;
    collective (one small check that they do).

    Parameters
    ----------
    comm : Communicator
        The ranks of the parameter server, servers and workers.
    tables : iterable of Table
        At least one, with distinct names.
    num_servers : int
        Ranks 0..num_servers-1 serve; between 1 and size-1.
    mode : str
        "sync", "async" or "ssp" (see the module's text).
    staleness : int
        ssp's bound s, >= 0.

    Returns
    -------
    Server or Worker
        This rank's part.

    Raises
    ------
    ValueError
        A mode, num_servers, staleness or tables outside those bounds.
    """
    tables = list(tables)
    if mode not in MODES:
        raise ValueError(f"ps.start: mode must be one of {MODES}, got {mode!r}")
    if not 1 <= num_servers < comm.size:
        raise ValueError(f"ps.start: num_servers must be between 1 and size-1 ({comm.size - 1}), got {num_servers}")
    if int(staleness) < 0:
        raise ValueError(f"ps.start: staleness must be >= 0, got {staleness}")
    names = [t.name for t in tables]
    if not tables or len(set(names)) != len(names):
        raise ValueError(f"ps.start: give at least one table, with distinct names (got {names})")
    # One small collective so that ranks which disagree fail together instead of misreading messages.
    _check_same_setup(comm, tables, num_servers, mode, staleness)
    if comm.rank < num_servers:
        return Server(comm, tables, num_servers, mode, int(staleness))
    return Worker(comm, tables, num_servers, mode, int(staleness))


def _check_same_setup(comm, tables, num_servers, mode, staleness):
    text = repr(
        ([(t.name, t.dim, t.rows, t.init_scale, t.optimizer, t.seed) for t in tables], num_servers, mode, staleness)
    )
    digest = int(np.frombuffer(hashlib.sha256(text.encode()).digest()[:8], np.int64)[0])
    # max of (d, -d) in one call: every rank's d is the same iff max(d) == -max(-d).
    bounds = np.array([digest, -digest], np.int64)
    comm.all_reduce(bounds, op="max")
    if bounds[0] != -bounds[1]:
        raise _core.InvalidArgument(
            f"ps.start: ranks were given different tables, num_servers, mode or staleness (this rank: {text})"
        )


def _pack(op, table, clock, keys, flags=0, values=None):
    keys = np.ascontiguousarray(keys, np.int64)
    header = np.array([op, table, clock, len(keys), flags], np.int64)
    parts = [header.view(np.uint8), keys.view(np.uint8)]
    if values is not None:
        parts.append(np.ascontiguousarray(values, np.float32).reshape(-1).view(np.uint8))
    return np.concatenate(parts)


def _unpack(message: np.ndarray):
    header = message[: _HEADER * 8].view(np.int64)
    op, table, clock, n, flags = (int(v) for v in header)
    keys = message[_HEADER * 8 : (_HEADER + n) * 8].view(np.int64)
    values = message[(_HEADER + n) * 8 :].view(np.float32)
    return op, table, clock, keys, flags, values


class _Shard:
    """The rows of one table that one server holds, and their optimizer state."""

    def __init__(self, table: Table, server: int, num_servers: int):
        self.table, self.server, self.num_servers = table, server, num_servers
        opt = table.optimizer
        self.adam = isinstance(opt, Adam)
        if table.sparse:
            self.index: dict = {}
            self.values = np.zeros((0, table.dim), np.float32)
        else:
            mine = np.arange(server, table.rows, num_servers, dtype=np.int64)
            self.values = initial_rows(table, mine)
        self.size = len(self.values)
        if self.adam:
            self.m = np.zeros_like(self.values)
            self.v = np.zeros_like(self.values)
            self.steps = np.zeros(len(self.values), np.int64)
        self.version = 0

    def rows_of(self, keys: np.ndarray) -> np.ndarray:
        """Local row numbers of keys (this server's), creating sparse rows on first touch."""
        if not self.table.sparse:
            return keys // self.num_servers
        index = self.index
        rows = np.fromiter((index.get(k, -1) for k in keys.tolist()), np.int64, len(keys))
        new = rows < 0
        if new.any():
            fresh = np.unique(keys[new])
            first = self.size
            for i, k in enumerate(fresh.tolist()):
                index[k] = first + i
            self._grow(first + len(fresh))
            self.values[first : first + len(fresh)] = initial_rows(self.table, fresh)
            rows = np.fromiter((index[k] for k in keys.tolist()), np.int64, len(keys))
        return rows

    def _grow(self, size: int):
        if size > len(self.values):
            capacity = max(size, 2 * len(self.values), 64)
            grown = np.zeros((capacity, self.table.dim), np.float32)
            grown[: self.size] = self.values[: self.size]
            self.values = grown
            if self.adam:
                for name in ("m", "v"):
                    old = getattr(self, name)
                    new = np.zeros_like(grown)
                    new[: self.size] = old[: self.size]
                    setattr(self, name, new)
                steps = np.zeros(capacity, np.int64)
                steps[: self.size] = self.steps[: self.size]
                self.steps = steps
        self.size = size

    def apply(self, rows: np.ndarray, grads: np.ndarray):
        """One optimizer step on the given (unique) local rows."""
        opt = self.table.optimizer
        if not self.adam:
            self.values[rows] -= np.float32(opt.lr) * grads
        else:
            self.steps[rows] += 1
            t = self.steps[rows].astype(np.float64)[:, None]
            m = self.m[rows] = opt.beta1 * self.m[rows] + (1 - opt.beta1) * grads
            v = self.v[rows] = opt.beta2 * self.v[rows] + (1 - opt.beta2) * grads * grads
            m_hat = m / (1 - opt.beta1**t)
            v_hat = v / (1 - opt.beta2**t)
            self.values[rows] -= (opt.lr * m_hat / (np.sqrt(v_hat) + opt.eps)).astype(np.float32)
        self.version += 1


def _combine(keys: np.ndarray, grads: np.ndarray):
    """Duplicate keys summed into one row each: hot keys travel once per push."""
    unique, inverse = np.unique(keys, return_inverse=True)
    if len(unique) == len(keys):
        order = np.argsort(keys, kind="stable")
        return keys[order], grads[order]
    summed = np.zeros((len(unique), grads.shape[1]), np.float32)
    np.add.at(summed, inverse, grads)
    return unique, summed


@dataclass
class ServeReport:
    """What a server did: requests served, rows moved, the workers that finished and that died."""

    pulls: int = 0
    """Pull requests answered."""
    pushes: int = 0
    """Push requests received."""
    rows_pulled: int = 0
    """Rows sent in answers to pulls."""
    rows_pushed: int = 0
    """Rows of gradients received."""
    finished: list = field(default_factory=list)
    """The ranks of the workers that called finish(), in order."""
    died: list = field(default_factory=list)
    """The ranks of the workers that died."""
    versions: dict = field(default_factory=dict)
    """Table name -> updates applied to this server's shard of it."""
    seconds: float = 0.0
    """How long serve() ran."""


class Server:
    """A server rank of the parameter server, as start() returns it: it holds its shard of every
    table (key k lives on server k % num_servers) and serve() answers the workers."""

    #: Always True on a Server.
    is_server = True

    def __init__(self, comm, tables, num_servers, mode, staleness):
        self.comm, self.tables, self.mode, self.staleness = comm, tables, mode, staleness
        self.num_servers = num_servers
        self.shards = [_Shard(t, comm.rank, num_servers) for t in tables]
        self.workers = list(range(num_servers, comm.size))
        self.live = set(self.workers)
        self.report = ServeReport()
        # Per table: each worker's pushes so far (its clock) and, in sync mode, the step being gathered.
        self.clock = [{w: 0 for w in self.workers} for _ in tables]
        self.gathering = [{} for _ in tables]  # sync: step -> {worker: (rows, grads)}
        self.waiting = []  # pulls that wait for their version or for slower workers

    def serve(self, poll_s: float = 0.1) -> ServeReport:
        """Answer workers until each has finished or died.

        Parameters
        ----------
        poll_s : float
            Seconds between checks for dead workers while no request arrives.

        Returns
        -------
        ServeReport
            What was done.
        """
        began = time.perf_counter()
        done = set()
        while self.live - done:
            try:
                source, _, nbytes = self.comm.probe(ANY_SOURCE, TAG_REQUEST, timeout=poll_s)
            except _core.Timeout:
                self._notice_deaths()
                continue
            except _core.PeerFailure:
                # No worker is left to send anything: every one said bye, closed or died.
                self._notice_deaths()
                for w in sorted(self.live - done):
                    self._declare_dead(w)
                continue
            message = np.empty(nbytes, np.uint8)
            work = self.comm.irecv(message, src=source, tag=TAG_REQUEST)
            work.wait()
            op, table, clock, keys, flags, values = _unpack(message)
            if op == _BYE:
                done.add(source)
                self.report.finished.append(source)
                self.live.discard(source)
                self._advance()
            elif op == _PULL:
                self.waiting.append((source, table, clock, keys.copy()))
                self._answer_ready_pulls()
            elif op == _PUSH:
                self._push(source, table, clock, keys, flags, values.reshape(len(keys), self.tables[table].dim))
            self._notice_deaths()
        self.report.versions = {t.name: s.version for t, s in zip(self.tables, self.shards)}
        self.report.seconds = time.perf_counter() - began
        return self.report

    def _notice_deaths(self):
        """A worker whose connection is gone and who has nothing queued any more is dead (what
        it sent before it died is served first; one that said bye is no longer live)."""
        for w in sorted(self.live):
            try:
                self.comm.iprobe(w, TAG_REQUEST)
            except _core.PeerFailure:
                self._declare_dead(w)

    def _declare_dead(self, w):
        self.live.discard(w)
        self.report.died.append(w)
        self.waiting = [p for p in self.waiting if p[0] != w]
        self._advance()

    def _push(self, worker, table, clock, keys, flags, grads):
        shard = self.shards[table]
        self.report.pushes += 1
        self.report.rows_pushed += len(keys)
        if not flags & _COMBINED:  # duplicate rows would lose updates in one fancy-indexed step
            keys, grads = _combine(keys, grads)
        rows = shard.rows_of(keys) if len(keys) else keys
        self.clock[table][worker] = clock + 1
        if self.mode == "sync":
            self.gathering[table].setdefault(clock, {})[worker] = (rows, grads.copy())
        elif len(keys):
            shard.apply(rows, grads)
        else:
            shard.version += 1
        self._advance()

    def _advance(self):
        """Applies the sync steps every live worker has pushed, then answers the pulls that may go."""
        for table, gathering in enumerate(self.gathering):
            shard = self.shards[table]
            while shard.version in gathering and self.live <= set(gathering[shard.version]):
                contributions = gathering.pop(shard.version)
                rows = [r for r, _ in contributions.values() if len(r)]
                if rows:
                    all_rows = np.concatenate(rows)
                    all_grads = np.concatenate([g for r, g in contributions.values() if len(r)])
                    unique, inverse = np.unique(all_rows, return_inverse=True)
                    mean = np.zeros((len(unique), shard.table.dim), np.float32)
                    np.add.at(mean, inverse, all_grads)
                    mean /= np.float32(len(contributions))
                    shard.apply(unique, mean)
                else:
                    shard.version += 1
                if not self.live:
                    break
        self._answer_ready_pulls()

    def _may_answer(self, worker, table, clock) -> bool:
        if self.mode == "sync":
            return self.shards[table].version >= clock or not self.live
        if self.mode == "ssp":
            slowest = min((self.clock[table][w] for w in self.live), default=clock)
            return clock - slowest <= self.staleness
        return True

    def _answer_ready_pulls(self):
        still = []
        for worker, table, clock, keys in self.waiting:
            if not self._may_answer(worker, table, clock):
                still.append((worker, table, clock, keys))
                continue
            shard = self.shards[table]
            rows = shard.rows_of(keys) if len(keys) else keys
            slowest = min((self.clock[table][w] for w in self.live), default=clock)
            header = np.array([shard.version, slowest], np.int64).view(np.uint8)
            reply = np.concatenate([header, np.ascontiguousarray(shard.values[rows]).reshape(-1).view(np.uint8)])
            try:
                self.comm.isend(reply, worker, TAG_REPLY).wait()
            except _core.PeerFailure:
                pass  # the worker died while it waited; _notice_deaths will count it
            self.report.pulls += 1
            self.report.rows_pulled += len(keys)
        self.waiting = still


class Worker:
    """A worker rank of the parameter server, as start() returns it: it pulls rows and pushes
    gradients, then calls finish()."""

    #: Always False on a Worker.
    is_server = False

    def __init__(self, comm, tables, num_servers, mode, staleness):
        self.comm, self.tables, self.mode, self.staleness = comm, tables, mode, staleness
        self.num_servers = num_servers
        self.by_name = {t.name: i for i, t in enumerate(tables)}
        self.clock = [0] * len(tables)
        self.versions = [0] * len(tables)
        self.slowest = [0] * len(tables)  # the slowest live worker's pushes, as the last pull saw it
        self.combine = True
        self._finished = False

    @property
    def worker_index(self) -> int:
        """This worker's number among the workers, 0..num_workers-1."""
        return self.comm.rank - self.num_servers

    @property
    def num_workers(self) -> int:
        """How many workers there are (the ranks at and above num_servers)."""
        return self.comm.size - self.num_servers

    def version(self, table: str) -> int:
        """Updates applied to `table` (the least over the servers the last pull read).

        Parameters
        ----------
        table : str
            The table's name.

        Returns
        -------
        int
            The version.

        Raises
        ------
        ValueError
            An unknown table, or this worker has finished.
        """
        return self.versions[self._table(table)[0]]

    def _table(self, name):
        if self._finished:
            raise ValueError("ps: this worker has finished")
        try:
            i = self.by_name[name]
        except KeyError:
            raise ValueError(f"ps: unknown table {name!r}; tables: {sorted(self.by_name)}") from None
        return i, self.tables[i]

    def _keys(self, table: Table, keys) -> np.ndarray:
        if keys is None:
            if table.sparse:
                raise ValueError(f"ps: table {table.name!r} is sparse: name the keys to pull")
            return np.arange(table.rows, dtype=np.int64)
        keys = np.asarray(keys)
        if keys.ndim != 1 or not (np.issubdtype(keys.dtype, np.integer) or keys.size == 0):
            raise ValueError(
                f"ps: keys of table {table.name!r} must be a 1-D integer array, got "
                f"{keys.dtype} with shape {keys.shape}"
            )
        keys = keys.astype(np.int64, copy=False)
        if keys.size and keys.min() < 0:
            raise ValueError(f"ps: table {table.name!r}: negative key {int(keys.min())}")
        if table.rows is not None and keys.size and keys.max() >= table.rows:
            raise ValueError(f"ps: table {table.name!r} has {table.rows} rows; key {int(keys.max())} is out of range")
        return keys

    def _split(self, keys):
        """Per server: the positions of the keys it holds."""
        owner = keys % self.num_servers
        return [np.flatnonzero(owner == s) for s in range(self.num_servers)]

    def pull(self, table: str, keys=None) -> np.ndarray:
        """The current rows of `keys`. In sync and ssp mode this waits as the mode says.

        Parameters
        ----------
        table : str
            The table's name.
        keys : np.ndarray, list or None
            1-D, non-negative (below rows for a dense table); None: all rows of a dense table.

        Returns
        -------
        np.ndarray
            [len(keys), dim] float32, in the order of `keys`.

        Raises
        ------
        ValueError
            An unknown table, bad keys, or this worker has finished.
        PeerFailure
            A server this pull needs died.
        """
        i, spec = self._table(table)
        keys = self._keys(spec, keys)
        unique, inverse = np.unique(keys, return_inverse=True)
        out = np.empty((len(unique), spec.dim), np.float32)
        parts = [(s, idx) for s, idx in enumerate(self._split(unique)) if len(idx)]
        replies = []
        for s, idx in parts:
            reply = np.empty(16 + 4 * len(idx) * spec.dim, np.uint8)
            replies.append((idx, reply, self.comm.irecv(reply, src=s, tag=TAG_REPLY)))
            self.comm.isend(_pack(_PULL, i, self.clock[i], unique[idx]), s, TAG_REQUEST).wait()
        versions, slowest = [], []
        for idx, reply, work in replies:
            work.wait()
            version, low = reply[:16].view(np.int64)
            versions.append(int(version))
            slowest.append(int(low))
            out[idx] = reply[16:].view(np.float32).reshape(len(idx), spec.dim)
        if versions:
            self.versions[i], self.slowest[i] = min(versions), min(slowest)
        return out[inverse]

    def push(self, table: str, keys, grads):
        """Send gradients of rows; the servers apply them with the table's optimizer. Every
        server hears of every push (an empty one where it holds none of the keys), which is how it
        counts steps.

        Parameters
        ----------
        table : str
            The table's name.
        keys : np.ndarray or list
            1-D, non-negative; duplicate keys are summed first.
        grads : np.ndarray
            [len(keys), dim] float32; any other dtype raises, never rounded silently.

        Raises
        ------
        ValueError
            An unknown table, bad keys, gradients of another dtype or shape, or this worker has
            finished.
        PeerFailure
            A server died.
        """
        i, spec = self._table(table)
        keys = self._keys(spec, keys)
        grads = np.asarray(grads)
        if grads.dtype != np.float32:
            raise ValueError(
                f"ps: push to {table!r}: gradients must be float32, as the table's rows are; got "
                f"{grads.dtype} (convert them yourself, e.g. np.asarray(grads, np.float32), "
                f"where rounding them is what you want)"
            )
        if grads.shape != (len(keys), spec.dim):
            raise ValueError(
                f"ps: push to {table!r}: gradients must have shape ({len(keys)}, {spec.dim}), got {grads.shape}"
            )
        if self.combine:
            keys, grads = _combine(keys, grads)
        works = []
        for s, idx in enumerate(self._split(keys)):
            message = _pack(_PUSH, i, self.clock[i], keys[idx], _COMBINED if self.combine else 0, grads[idx])
            works.append((message, self.comm.isend(message, s, TAG_REQUEST)))
        for _, work in works:
            work.wait()
        self.clock[i] += 1

    def finish(self):
        """Tells every server this worker is done (after its last push)."""
        if self._finished:
            return
        for s in range(self.num_servers):
            try:
                self.comm.isend(_pack(_BYE, 0, 0, np.zeros(0, np.int64)), s, TAG_REQUEST).wait()
            except _core.PeerFailure:
                pass  # a dead server has no one to tell
        self._finished = True
