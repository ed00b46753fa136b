"""The sweep: for each collective, dtype, op and size, run ringtree (each algorithm)
and then every peer on the same buffers, check each result, time each one, combine
the times over ranks, and print one nccl-tests table per ringtree algorithm.

Timing of one cell (implementation x placement x size), all ranks together:
  fill inputs, run once, count #wrong      (the check, and a probe: an implementation
                                            that rejects the call is marked n/a on all ranks)
  w warm-up runs, barrier, n timed runs    (no allocation, no Python work but the call)
  time = elapsed / n on each rank, then combined over ranks by -a (default: slowest)
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import time

import numpy as np

from . import collectives as colls
from . import device as device_mod
from . import impls as impls_mod
from . import load as load_mod
from . import options as options_mod
from . import report, verify
from .collectives import IP, OOP
from .impls import eprint
from .report import Cell, Row

EXIT_OK, EXIT_WRONG, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


class RankOps:
    """Control traffic of the bench itself (time combining, agreement), over ringtree."""

    def __init__(self, comm, average_mode: int):
        self.comm, self.mode = comm, average_mode

    def combine_times(self, local: list[float]) -> np.ndarray:
        buf = np.array(local, dtype=np.float64)
        if buf.size == 0:
            return buf
        mode = options_mod.AVERAGE_MODES[self.mode]
        if mode == "rank0":
            self.comm.broadcast(buf, root=0)
        elif mode == "avg":
            self.comm.all_reduce(buf, op="sum")
            buf /= self.comm.size
        else:
            self.comm.all_reduce(buf, op=mode)
        return buf

    def sum_ints(self, local: list[int]) -> np.ndarray:
        buf = np.array(local, dtype=np.int64)
        if buf.size:
            self.comm.all_reduce(buf, op="sum")
        return buf

    def any(self, flag: bool) -> bool:
        buf = np.array([1 if flag else 0], dtype=np.int32)
        self.comm.all_reduce(buf, op="max")
        return bool(buf[0])

    def gather_ints(self, value: int) -> np.ndarray:
        """Every rank's value, in rank order."""
        out = np.zeros(self.comm.size, dtype=np.int64)
        self.comm.all_gather(np.array([value], dtype=np.int64), out)
        return out

    def share_from_rank0(self, value: int) -> int:
        buf = np.array([value], dtype=np.int64)
        self.comm.broadcast(buf, root=0)
        return int(buf[0])


class Progress:
    """Where the sweep is, on rank 0's stderr only: a tqdm bar where stderr is a terminal and tqdm
    is installed, else whole lines (a launcher that relays lines, or a log, gets no half-drawn bar).
    Output printed while the bar shows goes through `pause()`, so it never starts on the bar's line."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.bar = total, 0, enabled and total > 1, None
        self.last_print = 0.0
        if self.enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, file=sys.stderr, unit="size", leave=False, dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def step(self, label: str):
        if not self.enabled:
            return
        self.done += 1
        if self.bar is not None:
            self.bar.set_description(label, refresh=False)
            self.bar.update(1)
            return
        now = time.monotonic()
        if now - self.last_print >= 2.0 or self.done == self.total:
            self.last_print = now
            eprint(f"[rt_bench] {self.done}/{self.total} {label}")

    @contextlib.contextmanager
    def pause(self):
        """Takes the bar off its line while the caller prints, and draws it again after."""
        if self.bar is None:
            yield
            return
        self.bar.clear()
        try:
            yield
        finally:
            sys.stdout.flush()
            self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()


class Sweep:
    def __init__(self, opts, rt, comm):
        self.opts, self.rt, self.comm = opts, rt, comm
        self.rank, self.nranks = comm.rank, comm.size
        self.ranks = RankOps(comm, opts.average)
        modes = dict(persistent=opts.persistent, group=opts.group, coalesced=opts.coalesced)
        self.algo_impls = [impls_mod.RingtreeImpl(rt, comm, a, opts.timeout, **modes) for a in opts.algos]
        self.p2p_impl = impls_mod.RingtreeImpl(rt, comm, None, opts.timeout, **modes)
        self.peers, self.peer_info, self.peer_absent = [], {}, {}
        self.rows: list[Row] = []
        self.notes: dict[tuple, str] = {}  # (collective, impl, dtype, op) -> n/a reason
        self.total_wrong = 0
        self.busbw_all: list[float] = []
        # --device cuda: device twins of the host buffers (see rtbench/device.py).
        self.dev = device_mod.DeviceBuffers(self.rank) if opts.device == "cuda" else None

    # ------------------------------------------------------------------ setup
    def open_peers(self):
        timeout = self.opts.timeout or 300.0
        self.peers, self.peer_info, self.peer_absent = impls_mod.open_peers(
            self.opts.peers,
            self.rank,
            self.nranks,
            self.ranks.share_from_rank0,
            self.opts.device,
            timeout,
            self.ranks.gather_ints,
        )

    def subjects_for(self, coll):
        return [self.p2p_impl] if coll.name == "sendrecv" else self.algo_impls

    def header_lines(self, pids) -> list[str]:
        o = self.opts
        step = f"{o.step_factor:g}(factor)" if o.step_factor > 1 else f"{o.step_bytes}(bytes)"
        avg = options_mod.AVERAGE_MODES[o.average]
        version = getattr(self.rt, "__version__", "?")
        lines = [
            f"# ringtree bench  ranks: {self.nranks}  launcher: {impls_mod.launcher_name()}  "
            f"ringtree {version}  python {platform.python_version()}  numpy {np.__version__}",
            f"# minBytes {o.min_bytes} maxBytes {o.max_bytes} step: {step} warmup iters: {o.warmup} "
            f"iters: {o.iters} validation: {int(o.check)} time across ranks: {avg} "
            f"(-a {o.average}) device: {o.device}",
            f"# algorithms: {','.join(o.algos)}  collectives: {','.join(o.collectives)}",
            "#",
            "# Using ranks",
        ]
        host = socket.gethostname()
        for r, pid in enumerate(pids):
            lines.append(f"#  Rank {r:2d} Pid {int(pid):7d} on {host} device {o.device}")
        status = getattr(self.comm, "status", None)
        if status is not None:
            found = status()
            if self.nranks > 1:
                lines.append(f"# ringtree transports from rank 0: {', '.join(sorted(set(found.transports[1:])))}")
            lines.append(f"# ringtree topology (shared-memory groups): {found.hosts}")
        if o.peers:
            lines.append("#")
            lines.append("# Peers (measured right after ringtree at each size, same buffers):")
            for name in o.peers:
                if name in self.peer_info:
                    lines.append(f"#   {name:7s} {self.peer_info[name]}")
                else:
                    lines.append(f"#   {name:7s} absent: {self.peer_absent[name]}")
            lines.append(
                "# ratio = ringtree busbw / peer busbw (same size; ringtree in the peer's "
                "placement); > 1 means ringtree is faster"
            )
        lines.append("#")
        return lines

    # ------------------------------------------------------------------ one cell
    def fill(self, coll, placement, inp, out, input_vals, dtype_name):
        # Sentinel first, so an output element the collective never writes is caught;
        # in place, the input is then written over its part of the output.
        out[...] = verify.sentinel(dtype_name)
        np.copyto(inp, input_vals[: inp.size].reshape(inp.shape))

    def run_cell(self, impl, coll, placement, bufs, n, op, dtype_name, input_vals, expected, tol):
        """(local seconds, local #wrong or None) or (None, reason) when the call was rejected."""
        o = self.opts
        send_buf, recv_buf = bufs[0], bufs[1]
        inp, out = coll.views(placement, send_buf, recv_buf, n, self.nranks, self.rank)
        dinp = dout = None
        if self.dev is not None:  # the call runs on the device twins of the same views
            dinp, dout = coll.views(placement, bufs[2], bufs[3], n, self.nranks, self.rank)
        call = impl.make_call(
            coll, placement, inp if dinp is None else dinp, out if dout is None else dout, n, op, o.root
        )
        self.fill(coll, placement, inp, out, input_vals, dtype_name)
        if self.dev is not None:
            self.dev.upload(bufs[2], send_buf)
            self.dev.upload(bufs[3], recv_buf)
        failure = None
        try:
            call()
            if self.dev is not None:
                self.dev.synchronize()
                self.dev.download(out, dout)
        except impl.skippable as exc:
            failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if self.ranks.any(failure is not None):
            return None, failure or "rejected on another rank"
        wrong = None
        if not impl.checked:
            pass  # computes nothing (the raw-socket rings): no result to count
        elif o.check and expected is not None:
            if o.inject_error and impl.is_subject:
                verify.corrupt(out, expected)
            wrong = verify.count_wrong(out, expected, tol)
        elif o.check:
            wrong = 0  # this rank holds no defined output (non-root of reduce/gather)
        for _ in range(o.warmup):
            call()
        if self.dev is not None:
            self.dev.synchronize()
        impl.barrier()
        start = time.perf_counter()
        for _ in range(o.iters):
            call()
        if self.dev is not None:
            self.dev.synchronize()
        return (time.perf_counter() - start) / o.iters, wrong

    def run_memcpy(self, impl, coll, bufs, n):
        """Rank 0 copies alone while the others wait in a ringtree barrier."""
        o = self.opts
        self.comm.barrier()
        seconds = None
        if self.rank == 0:
            send_buf, recv_buf = (bufs[0], bufs[1]) if self.dev is None else (bufs[2], bufs[3])
            inp, out = coll.views(OOP, send_buf, recv_buf, n, self.nranks, self.rank)
            call = impl.make_call(coll, OOP, inp, out, n, None, 0)
            for _ in range(o.warmup + 1):
                call()
            if self.dev is not None:
                self.dev.synchronize()
            start = time.perf_counter()
            for _ in range(o.iters):
                call()
            if self.dev is not None:
                self.dev.synchronize()
            seconds = (time.perf_counter() - start) / o.iters
        self.comm.barrier()
        return seconds

    # ------------------------------------------------------------------ one size
    def measure_size(self, coll, dtype_name, op, size_req, bufs) -> Row:
        dt = verify.np_dtype(dtype_name)
        n = coll.count_for_bytes(size_req, dt.itemsize, self.nranks)
        input_vals = verify.make_input(coll, self.rank, n, self.nranks, op, dtype_name)
        expected = (
            verify.make_expected(coll, self.rank, n, self.nranks, self.opts.root, op, dtype_name)
            if self.opts.check
            else None
        )
        tol = verify.tolerance(op, dtype_name, self.nranks)
        cells: dict = {}
        ran = []  # (impl name, placement, local seconds, local wrong) in the same order on every rank
        memcpy_cells = []
        for impl in self.subjects_for(coll) + self.peers:
            for placement in impl.placements(coll):
                if impl.rank0_only:
                    memcpy_cells.append((impl, placement))
                    continue
                reason = impl.unsupported(coll, dtype_name, op)
                if reason is None:
                    seconds, wrong = self.run_cell(
                        impl, coll, placement, bufs, n, op, dtype_name, input_vals, expected, tol
                    )
                    if seconds is None:
                        reason = wrong
                    else:
                        ran.append((impl.name, placement, seconds, wrong))
                if reason is not None:
                    cells.setdefault(impl.name, {})[placement] = Cell(na=reason)
                    self.notes.setdefault((coll.name, impl.name, dtype_name, op or "none"), reason)
        times = self.ranks.combine_times([t for _, _, t, _ in ran])
        wrongs = self.ranks.sum_ints([-1 if w is None else w for *_, w in ran])
        for (name, placement, _, _), t, w in zip(ran, times, wrongs):
            cells.setdefault(name, {})[placement] = Cell(seconds=float(t), wrong=None if w < 0 else int(w))
        for impl, placement in memcpy_cells:
            seconds = self.run_memcpy(impl, coll, bufs, n)
            cells.setdefault(impl.name, {})[placement] = (
                Cell(seconds=seconds, factor=1.0) if self.rank == 0 else Cell(na="measured on rank 0")
            )
        size = coll.size_bytes(n, dt.itemsize, self.nranks)
        return Row(
            collective=coll.name,
            dtype=dtype_name,
            op=op or "none",
            root=self.opts.root if coll.rooted else -1,
            size=size,
            count=n,
            nranks=self.nranks,
            factor=coll.busbw_factor(self.nranks),
            cells=cells,
        )

    # ------------------------------------------------------------------ sweep
    def allocate(self, coll, dtype_name):
        dt = verify.np_dtype(dtype_name)
        n_max = max(coll.count_for_bytes(s, dt.itemsize, self.nranks) for s in self.opts.sizes)
        send_count = max(coll.send_count(n_max, self.nranks), coll.recv_count(n_max, self.nranks))
        # zeros, not empty: garbage floats could be denormals or NaNs and skew the first timings.
        host = (np.zeros(send_count, dtype=dt), np.zeros(coll.recv_count(n_max, self.nranks), dtype=dt))
        if self.dev is None:
            return host
        return host + (self.dev.like(host[0]), self.dev.like(host[1]))

    def cell_count(self) -> int:
        total = 0
        for name in self.opts.collectives:
            ops = len(self.opts.ops) if colls.get(name).reduction else 1
            total += ops * len(self.opts.dtypes) * len(self.opts.sizes)
        return total

    def run(self) -> int:
        o = self.opts
        pids = np.zeros(self.nranks, dtype=np.int64)
        self.comm.all_gather(np.array([os.getpid()], dtype=np.int64), pids)
        self.open_peers()
        if self.rank == 0:
            print("\n".join(self.header_lines(pids)), flush=True)
        progress = Progress(self.cell_count(), o.progress and self.rank == 0)
        try:
            for name in o.collectives:
                coll = colls.get(name)
                rows = []
                for dtype_name in o.dtypes:
                    bufs = self.allocate(coll, dtype_name)
                    for op in o.ops if coll.reduction else [None]:
                        for size in o.sizes:
                            rows.append(self.measure_size(coll, dtype_name, op, size, bufs))
                            progress.step(f"{name} {dtype_name} {op or ''} {size}B")
                    del bufs
                self.rows += rows
                if self.rank == 0:
                    with progress.pause():
                        self.print_tables(coll, rows)
        finally:
            progress.close()
        return self.finish()

    def print_tables(self, coll, rows):
        o = self.opts
        peer_cols = [(p.name, p.placements(coll)[0]) for p in self.peers]
        for subject in self.subjects_for(coll):
            if not any(
                c is not None and c.ran
                for row in rows
                for c in (row.cell(subject.name, OOP), row.cell(subject.name, IP))
            ):
                # e.g. --algo all on a collective without that algorithm: one line, no empty table.
                reasons = sorted({c.na for row in rows for c in row.cells.get(subject.name, {}).values() if c.na})
                print(f"# {subject.name} {coll.name}: not measured: {'; '.join(reasons) or 'no sizes'}\n#", flush=True)
                continue
            lines, avg_busbw, wrong = report.format_table(rows, subject.name, peer_cols, o.check, self.nranks)
            self.total_wrong += wrong
            for row in rows:
                for placement in (OOP, IP):
                    cell = row.cell(subject.name, placement)
                    if cell is not None and cell.ran:
                        self.busbw_all.append(row.bw(cell)[1])
            lines += report.footer_lines(wrong, avg_busbw, o.check)
            if subject.algo == "auto":
                lines += self.auto_choice_lines(coll, rows)
                lines += self.cost_model_lines(coll, rows)
            lines += self.note_lines(coll, subject.name, rows)
            print("\n".join(lines), flush=True)

    def auto_choice_lines(self, coll, rows) -> list[str]:
        """What algo='auto' picked at each size, from ringtree's cost model."""
        choose = getattr(self.comm, "choose_algo", None)
        if choose is None:
            return []
        lines = []
        # Where ranks outnumber cores a large broadcast asks its root first: its pages decide.
        status = getattr(self.comm, "status", None)
        asks = getattr(status(), "broadcast_asks_root", (0, 0)) if status and coll.name == "broadcast" else (0, 0)
        for dtype_name in dict.fromkeys(r.dtype for r in rows):
            itemsize = verify.np_dtype(dtype_name).itemsize
            spans = []  # [algo, first size, last size]
            for size, count in dict.fromkeys((r.size, r.count) for r in rows if r.dtype == dtype_name):
                try:
                    algo = choose(coll.name, count * itemsize, "auto")
                except Exception as exc:  # the model may not price every collective
                    return [f"# auto choice: unavailable ({type(exc).__name__}: {exc})"]
                if asks[0] <= count * itemsize < asks[1] and algo in ("tree", "ring"):
                    algo += " (direct where the root's buffer is on huge pages: it is asked)"
                if spans and spans[-1][0] == algo:
                    spans[-1][2] = size
                else:
                    spans.append([algo, size, size])
            text = ", ".join(f"{a} {lo}..{hi} B" if lo != hi else f"{a} {lo} B" for a, lo, hi in spans)
            lines.append(f"# auto chose ({dtype_name}): {text}")
        return lines + ["#"]

    def cost_model_lines(self, coll, rows) -> list[str]:
        """The cost model against the measurements: every explicit algorithm's measured and
        predicted time at each size, the measured best, auto's choice, and the measured time of
        auto's choice over the best's (the goal: within 1.10 at every size)."""
        estimate = getattr(self.comm, "estimate", None)
        # rank_order is deterministic mode's schedule: auto never weighs it against the others.
        explicit = [i for i in self.subjects_for(coll) if i.algo not in (None, "auto", "rank_order")]
        if estimate is None or not explicit:
            return []
        placement = IP if coll.name == "broadcast" else OOP
        head = "".join(f" {i.algo + ' meas':>13s} {'pred':>9s}" for i in explicit)
        lines = [
            f"# Cost model vs measured ({coll.name}, {placement}, slowest rank, us): "
            f"auto/best = measured time of auto's choice / best measured",
            f"#{'size':>12s} {'dtype':>9s}{head} {'best':>8s} {'auto':>8s} {'auto/best':>9s}",
        ]
        within = total = 0
        for row in rows:
            nbytes = row.count * verify.np_dtype(row.dtype).itemsize
            try:
                predicted = {a: t for a, t, _ in estimate(coll.name, nbytes, row.dtype)}
                chosen = self.comm.choose_algo(coll.name, nbytes, "auto", row.dtype)
            except Exception as exc:  # noqa: BLE001 - the model may not price every call
                return [f"# cost model: unavailable ({type(exc).__name__}: {exc})", "#"]
            measured = {}
            text = ""
            for impl in explicit:
                cell = row.cell(impl.name, placement)
                t = cell.seconds if cell is not None and cell.ran else None
                if t is not None:
                    measured[impl.algo] = t
                pred = predicted.get(impl.algo)
                text += (f" {t * 1e6:13.1f}" if t is not None else f" {'n/a':>13s}") + (
                    f" {pred * 1e6:9.1f}" if pred is not None else f" {'n/a':>9s}"
                )
            if not measured:
                continue
            best = min(measured, key=measured.get)
            ratio = measured[chosen] / measured[best] if chosen in measured else float("nan")
            total += 1
            within += ratio <= 1.10
            # '#'-prefixed like every non-result line, so table parsers skip it
            lines.append(f"#{row.size:12d} {row.dtype:>9s}{text} {best:>8s} {chosen:>8s} {ratio:9.2f}")
        lines.append(f"# auto within 10% of the best measured algorithm at {within} of {total} sizes")
        return lines + ["#"]

    def note_lines(self, coll, subject_name, rows) -> list[str]:
        lines = []
        grouped: dict[tuple[str, str], list[str]] = {}  # (impl, reason) -> ["dtype/op", ...]
        for (cname, impl, dtype_name, op), reason in self.notes.items():
            if cname == coll.name and (impl == subject_name or not impl.startswith("ringtree")):
                grouped.setdefault((impl, reason), []).append(dtype_name if op == "none" else f"{dtype_name}/{op}")
        for (impl, reason), where in grouped.items():
            lines.append(f"# n/a: {impl}: {reason} ({' '.join(where)})")
        for peer in self.peers:
            if peer.rank0_only:
                continue
            wrong = sum(
                (row.cell(peer.name, pl).wrong or 0)
                for row in rows
                for pl in peer.placements(coll)
                if row.cell(peer.name, pl) and row.cell(peer.name, pl).ran
            )
            if self.opts.check:
                lines.append(
                    f"# peer check: {peer.name} {wrong} wrong"
                    + ("" if wrong == 0 else "  (the peer disagrees with the expected values)")
                )
        return lines + (["#"] if lines else [])

    def finish(self) -> int:
        o = self.opts
        # Every rank needs the verdict for its exit code; rows hold #wrong summed over ranks.
        wrong = 0
        for row in self.rows:
            for subject in self.subjects_for(colls.get(row.collective)):
                for placement in (OOP, IP):
                    cell = row.cell(subject.name, placement)
                    if cell is not None and cell.ran:
                        wrong += cell.wrong or 0
        if self.rank == 0:
            avg = sum(self.busbw_all) / len(self.busbw_all) if self.busbw_all else 0.0
            print("# Summary over all tables", flush=True)
            print("\n".join(report.footer_lines(wrong, avg, o.check)), flush=True)
            if self.dev is not None:
                print(f"# CUDA executor: {self.comm.status().cuda_executor}", flush=True)
            if o.json_path:
                header = {
                    "nranks": self.nranks,
                    "launcher": impls_mod.launcher_name(),
                    "options": {k: v for k, v in vars(o).items() if k != "extra"},
                    "peers": self.peer_info,
                    "peers_absent": self.peer_absent,
                }
                with open(o.json_path, "w") as fh:
                    fh.write(report.rows_to_json(self.rows, header))
            if o.plot_path:
                from . import plot

                try:
                    plot.plot_rows(
                        self.rows,
                        [i.name for i in self.algo_impls] + [self.p2p_impl.name],
                        [p.name for p in self.peers],
                        o.plot_path,
                        self.nranks,
                    )
                except ImportError as exc:
                    eprint(f"rt_bench: --plot needs matplotlib ({exc}); pip install matplotlib")
        for peer in self.peers:
            peer.close()
        return EXIT_WRONG if wrong else EXIT_OK


def env_rank() -> int | None:
    for key in ("RINGTREE_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK"):
        if key in os.environ:
            try:
                return int(os.environ[key])
            except ValueError:
                pass
    return None


def main(argv=None) -> int:
    opts = options_mod.parse_args(argv)
    quiet = env_rank() not in (None, 0)
    # --background-load: rank 0 alone starts the burners, before ringtree starts, and they stop
    # however the job ends (see rtbench/load.py).
    with load_mod.BackgroundLoad(0 if quiet else opts.background_load) as background:
        if background.n:
            print(f"# background load: {load_mod.describe(background)}", flush=True)
        return _main(opts, quiet)


def _main(opts, quiet) -> int:
    try:
        import ringtree as rt
    except ImportError as exc:
        if not quiet:
            eprint(
                f"rt_bench: cannot import ringtree ({exc}); install it with "
                "`pip install -e . --no-build-isolation` from the repository root"
            )
        return EXIT_ERROR
    if opts.device == "cuda":
        why = device_mod.why_no_cuda(rt)
        if why is not None:
            if opts.if_gpu:
                if not quiet:
                    print(f"# rt_bench --device cuda: no device sweep on this machine: {why}", flush=True)
                return EXIT_OK
            if not quiet:
                eprint(f"rt_bench: --device cuda cannot run here: {why}; use --device cpu")
            return EXIT_USAGE
    for name in opts.dtypes:
        try:
            verify.np_dtype(name)
        except RuntimeError as exc:
            if not quiet:
                eprint(f"rt_bench: {exc}")
            return EXIT_USAGE
    if opts.trace_dir:
        os.environ["RINGTREE_TRACE"] = opts.trace_dir  # read when the communicator closes
    comm = rt.init()
    try:
        if any(colls.get(c).rooted for c in opts.collectives) and opts.root >= comm.size:
            if comm.rank == 0:
                eprint(f"rt_bench: -r {opts.root} is not a rank of a {comm.size}-rank world")
            return EXIT_USAGE
        return Sweep(opts, rt, comm).run()
    except rt.Error as exc:
        eprint(f"rt_bench: rank {comm.rank}: {type(exc).__name__}: {exc}")
        return EXIT_ERROR
    finally:
        comm.close()
