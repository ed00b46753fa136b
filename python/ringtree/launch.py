"""Start P local ranks of a Python program, like `torchrun --nproc-per-node P`.

    python -m ringtree.launch -n 4 script.py [args...]
    python -m ringtree.launch -n 4 -m package.module [args...]

Each rank gets RINGTREE_RANK, RINGTREE_WORLD_SIZE and RINGTREE_UNIQUE_ID. --hosts H places the
ranks on H emulated hosts (RINGTREE_HOSTNAME), so TCP carries traffic between the groups on
one machine. If a rank fails, the others are stopped and its exit code is returned.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from . import _core, _settings


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m ringtree.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nproc", type=int, required=True, help="number of local ranks")
    p.add_argument("--hosts", type=int, default=1, help="emulate this many hosts (contiguous rank groups)")
    p.add_argument("--timeout", type=float, default=None, help="kill every rank after this many seconds")
    p.add_argument("-m", dest="module", default=None, help="run a module instead of a script")
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
    procs = []
    for r in range(args.nproc):
        env = rank_environment(r, args.nproc, str(uid), args.hosts)
        pass_fds = ()
        if r == 0 and listen_fd >= 0:
            _settings.put(env, "RINGTREE_LISTEN_FD", str(listen_fd))
            pass_fds = (listen_fd,)
        procs.append(subprocess.Popen(command, env=env, pass_fds=pass_fds))
    if listen_fd >= 0:
        os.close(listen_fd)
    return supervise(procs, args.timeout)


def supervise(procs, timeout=None, name="ringtree.launch") -> int:
    """Waits for every rank process; when one fails, or `timeout` seconds pass, stops the others.
    Returns the first failing exit code (124 on timeout, 130 on Ctrl-C), else 0."""
    deadline = None if timeout is None else time.monotonic() + timeout
    exit_code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                exit_code = failed[0].returncode
                print(f"{name}: a rank exited with code {exit_code}; stopping the others", file=sys.stderr)
                break
            if deadline is not None and time.monotonic() > deadline:
                exit_code = 124
                print(f"{name}: timed out after {timeout} s; stopping every rank", file=sys.stderr)
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
