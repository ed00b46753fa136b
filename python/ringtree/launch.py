"""Start P local ranks of a Python program, like `torchrun --nproc-per-node P`.

    python -m ringtree.launch -n 4 script.py [args...]
    python -m ringtree.launch -n 4 -m package.module [args...]

Each rank gets RINGTREE_RANK, RINGTREE_WORLD_SIZE and RINGTREE_UNIQUE_ID. --hosts H places the
ranks on H emulated hosts (RINGTREE_HOSTNAME), so TCP carries traffic between the groups on
one machine. If a rank fails, the others are stopped and its exit code is returned.

With more than one rank (or --label), each line a rank writes to stdout or stderr is copied to the
launcher's own, whole and prefixed with the rank, as `mpiexec -l` does: `[1] loss 0.25`. Lines of
different ranks never mix, and a line is never split. The ranks then run with PYTHONUNBUFFERED=1
(unless it is set), so their lines arrive as they are printed. --no-label passes the ranks'
output through untouched, for programs that read it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from . import _core, _settings


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m ringtree.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nproc", type=int, required=True, help="number of local ranks")
    p.add_argument("--hosts", type=int, default=1, help="emulate this many hosts (contiguous rank groups)")
    p.add_argument("--timeout", type=float, default=None, help="kill every rank after this many seconds")
    p.add_argument("-m", dest="module", default=None, help="run a module instead of a script")
    p.add_argument(
        "-l",
        "--label",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prefix each output line with its rank, '[r] ' (default: on with more than one rank)",
    )
    p.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args...] (or module args with -m)")
    args = p.parse_args(argv)
    if args.nproc < 1:
        p.error("-n must be at least 1")
    if not 1 <= args.hosts <= args.nproc:
        p.error("--hosts must be between 1 and -n")
    if args.module is None and not args.program:
        p.error("give a script (or -m module)")
    return args


def rank_environment(rank: int, size: int, token: str, hosts: int, base=None) -> dict:
    env = dict(os.environ if base is None else base)
    _settings.put(env, "RINGTREE_RANK", str(rank))
    _settings.put(env, "RINGTREE_WORLD_SIZE", str(size))
    _settings.put(env, "RINGTREE_UNIQUE_ID", token)
    if hosts > 1:
        _settings.put(env, "RINGTREE_HOSTNAME", f"emulated-host-{rank * hosts // size}")
    return env


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    uid = _core.UniqueId.create()
    command = [sys.executable] + (["-m", args.module] if args.module else []) + args.program
    # Rank 0 inherits the socket that reserved the port, so no other process can take it.
    listen_fd = uid.take_listener()
    relay = LineRelay() if (args.nproc > 1 if args.label is None else args.label) else None
    pipe = subprocess.PIPE if relay else None
    procs = []
    for r in range(args.nproc):
        env = rank_environment(r, args.nproc, str(uid), args.hosts)
        if relay:
            env.setdefault("PYTHONUNBUFFERED", "1")
        pass_fds = ()
        if r == 0 and listen_fd >= 0:
            _settings.put(env, "RINGTREE_LISTEN_FD", str(listen_fd))
            pass_fds = (listen_fd,)
        procs.append(subprocess.Popen(command, env=env, pass_fds=pass_fds, stdout=pipe, stderr=pipe))
        if relay:
            relay.follow(procs[-1].stdout, r, sys.stdout)
            relay.follow(procs[-1].stderr, r, sys.stderr)
    if listen_fd >= 0:
        os.close(listen_fd)
    try:
        return supervise(procs, args.timeout, relay=relay)
    finally:
        if relay:
            relay.finish()


class LineRelay:
    """Copies the ranks' pipes to the launcher's stdout and stderr a whole line at a time, each
    line prefixed with its rank. One lock covers both streams, so on a terminal where they meet a
    line of one rank is never cut by another's; a last line without a newline gets one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._threads = []

    def follow(self, pipe, rank: int, stream) -> None:
        t = threading.Thread(target=self._copy, args=(pipe, f"[{rank}] ".encode(), stream), daemon=True)
        t.start()
        self._threads.append(t)

    def say(self, text: str, stream=None) -> None:
        """A line of the launcher's own, between the ranks' lines."""
        self._write(stream or sys.stderr, (text + "\n").encode())

    def finish(self, timeout: float = 10.0) -> None:
        """Waits for what the ranks wrote before they exited (a process they started and left
        running may hold a pipe open: its later lines are not waited for)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _copy(self, pipe, prefix: bytes, stream) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                self._write(stream, prefix + (line if line.endswith(b"\n") else line + b"\n"))

    def _write(self, stream, data: bytes) -> None:
        with self._lock:
            binary = getattr(stream, "buffer", None)
            if binary is not None:
                stream.flush()
                binary.write(data)
                binary.flush()
            else:
                stream.write(data.decode(errors="replace"))
                stream.flush()


def supervise(procs, timeout=None, name="ringtree.launch", relay=None) -> int:
    """Waits for every rank process; when one fails, or `timeout` seconds pass, stops the others.
    Returns the first failing exit code (124 on timeout, 130 on Ctrl-C), else 0. With a `relay`
    (LineRelay) its own messages go between the ranks' lines."""
    say = relay.say if relay else lambda text: print(text, file=sys.stderr, flush=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    exit_code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                exit_code = failed[0].returncode
                say(f"{name}: a rank exited with code {exit_code}; stopping the others")
                break
            if deadline is not None and time.monotonic() > deadline:
                exit_code = 124
                say(f"{name}: timed out after {timeout} s; stopping every rank")
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        exit_code = 130
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if exit_code == 0:
        exit_code = next((p.returncode for p in procs if p.returncode != 0), 0)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
