"""Elastic data-parallel training on ringtree: lose a rank, shrink, carry on, grow back.

    python examples/elastic_train.py            # starts its own 4 rank processes
    options: --steps 60 --kill-step 15 --grow-step 35 --batch 32 --lr 0.05 --timeout 10

This process is the launcher: it makes a unique id, starts 4 ranks, and later starts one
replacement with the token the ranks publish. The ranks train a small MLP with
DataParallelHook over a ProcessGroupRingtree. Every rank draws its own batch of --batch
samples per step (seeded by step and rank), so the global batch is world x batch, and the
learning rate follows it linearly (lr x world / 4). Rank 0 checkpoints every 5 steps.

At --kill-step, rank 2 SIGKILLs itself between forward and backward; the others' backward
raises PeerFailure (or Aborted), they shrink to 3 ranks, reload the last checkpoint and
continue. At --grow-step the 3 ranks checkpoint and grow by one: rank 0 publishes the token
in a file, this launcher starts the replacement with it, the replacement loads the
checkpoint and the 4 ranks continue. At the end every rank checks that its parameters equal
rank 0's bit for bit and that the loss fell; the launcher exits non-zero if any rank failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

INPUTS, HIDDEN, CLASSES = 32, 64, 8
FULL_WORLD = 4
TOKEN_VARIABLE = "ELASTIC_TRAIN_ID"  # the unique id, then the grow token, for the rank processes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--kill-step", type=int, default=15)
    p.add_argument("--grow-step", type=int, default=35)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate at 4 ranks")
    p.add_argument("--timeout", type=float, default=10.0)
    # Set by the launcher for the rank processes. The unique id and the grow token carry the job's
    # secret, so they travel in the environment (TOKEN_VARIABLE), which other users cannot read,
    # never on the command line, which any user's ps shows.
    p.add_argument("--rank", type=int)
    p.add_argument("--join", action="store_true")
    p.add_argument("--workdir")
    return p.parse_args(argv)


# --- the rank processes ------------------------------------------------------------------------


def rank_main(args):
    import torch

    import ringtree as rt
    import ringtree.torch as rtt

    def log(comm, text):
        sys.stdout.write(f"[rank {comm.rank}/{comm.size}] {text}\n")  # one write: lines stay whole
        sys.stdout.flush()

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(INPUTS, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))

    def batch(step, rank):
        teacher = torch.Generator().manual_seed(1234)
        weights = torch.randn(INPUTS, CLASSES, generator=teacher)
        data = torch.Generator().manual_seed(100_000 * step + rank)
        x = torch.randn(args.batch, INPUTS, generator=data)
        return x, (x @ weights).argmax(dim=1)

    checkpoint = os.path.join(args.workdir, "checkpoint.pt")

    def save(step, model, optimizer):
        tmp = checkpoint + ".tmp"
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
        os.replace(tmp, checkpoint)

    def attach(comm, model, optimizer, step):
        """The process group, gradient hook and learning rate of a (new) world."""
        group = rtt.ProcessGroupRingtree(comm)
        hook = rtt.DataParallelHook(model, group)  # broadcasts rank 0's parameters
        for g in optimizer.param_groups:
            g["lr"] = args.lr * comm.size / FULL_WORLD
        log(
            comm,
            f"step {step}: world {comm.size}, global batch {comm.size * args.batch}, "
            f"lr {optimizer.param_groups[0]['lr']:.4f}",
        )
        return group, hook

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    if args.join:
        comm = rt.join(os.environ[TOKEN_VARIABLE], timeout=args.timeout)
        state = torch.load(checkpoint)  # written by the members just before they grew
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        log(comm, f"joined at step {step} from the checkpoint")
    else:
        comm = rt.init(rank=args.rank, size=FULL_WORLD, unique_id=os.environ[TOKEN_VARIABLE], timeout=args.timeout)
    group, hook = attach(comm, model, optimizer, step)
    losses = {}
    while step < args.steps:
        if step == args.grow_step and comm.size < FULL_WORLD:
            if comm.rank == 0:
                save(step, model, optimizer)
            comm.barrier()  # the checkpoint is on disk before the joiner can read it

            def publish(token):
                with open(os.path.join(args.workdir, "grow.tmp"), "w") as f:
                    f.write(token)
                os.replace(os.path.join(args.workdir, "grow.tmp"), os.path.join(args.workdir, "grow.token"))

            hook.remove()
            bigger = comm.grow(FULL_WORLD - comm.size, publish=publish if comm.rank == 0 else None)
            comm.close()
            comm = bigger
            group, hook = attach(comm, model, optimizer, step)
        try:
            x, y = batch(step, comm.rank)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if step == args.kill_step and comm.size == FULL_WORLD and comm.rank == 2 and not args.join:
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: the others are in backward
            loss.backward()  # gradients averaged over the world by the hook
            optimizer.step()
            optimizer.zero_grad()
            mean = loss.detach().reshape(1).clone()
            group.allreduce([mean]).wait()
            losses[step] = float(mean) / comm.size
            if comm.rank == 0 and step % 5 == 0:
                log(comm, f"step {step}: loss {losses[step]:.4f}")
                save(step + 1, model, optimizer)
            step += 1
        except rt.Error as exc:
            log(comm, f"step {step}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            try:
                hook.remove()
            except rt.Error:
                pass  # the failed step's error again
            optimizer.zero_grad()
            old_size = comm.size
            comm = comm.shrink(timeout=args.timeout)
            state = torch.load(checkpoint)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            log(
                comm,
                f"shrank from {old_size} to {comm.size} ranks; back to the checkpoint of step "
                f"{state['step']} (lost {step - state['step']} steps)",
            )
            step = state["step"]
            group, hook = attach(comm, model, optimizer, step)
    hook.remove()
    # Every rank ends with rank 0's parameters, bit for bit.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    comm.broadcast(reference, root=0)
    same = bool(torch.equal(flat, reference))
    first = sum(losses[s] for s in range(3)) / 3 if all(s in losses for s in range(3)) else None
    last = sum(losses[s] for s in range(args.steps - 3, args.steps)) / 3
    fell = first is None or last < 0.8 * first  # a joiner did not see the first steps
    verdict = torch.tensor([int(same and fell)], dtype=torch.int64)
    comm.all_reduce(verdict, op="min")
    log(
        comm,
        f"final: parameters equal to rank 0's: {same}; loss {first if first is None else round(first, 4)} "
        f"-> {last:.4f}; all ranks agree: {bool(verdict.item())}",
    )
    comm.close()
    return 0 if verdict.item() else 1


# --- the launcher ----------------------------------------------------------------------------


def launch(args):
    import ringtree as rt

    workdir = tempfile.mkdtemp(prefix="elastic-train-")
    uid = rt.UniqueId.create()
    common = [
        sys.executable,
        os.path.abspath(__file__),
        "--workdir",
        workdir,
        "--steps",
        str(args.steps),
        "--kill-step",
        str(args.kill_step),
        "--grow-step",
        str(args.grow_step),
        "--batch",
        str(args.batch),
        "--lr",
        str(args.lr),
        "--timeout",
        str(args.timeout),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTREE_")}
    env["OMP_NUM_THREADS"] = "1"  # 4 ranks on a few cores
    procs = [
        subprocess.Popen(common + ["--rank", str(r)], env={**env, TOKEN_VARIABLE: str(uid)}) for r in range(FULL_WORLD)
    ]
    token_file = os.path.join(workdir, "grow.token")
    deadline = time.monotonic() + 120
    joiner = None
    while time.monotonic() < deadline and any(p.poll() is None for p in procs + ([joiner] if joiner else [])):
        if joiner is None and os.path.exists(token_file):
            with open(token_file) as f:
                token = f.read()
            print("[launcher] starting a replacement rank with the grow token", flush=True)
            joiner = subprocess.Popen(common + ["--join"], env={**env, TOKEN_VARIABLE: token})
        time.sleep(0.05)
    everyone = procs + ([joiner] if joiner else [])
    for p in everyone:
        if p.poll() is None:
            p.kill()
            p.wait()
    codes = [p.returncode for p in everyone]
    expected = [0, 0, -signal.SIGKILL, 0, 0]
    print(f"[launcher] exit codes {codes} (rank 2 killed on purpose)", flush=True)
    return 0 if codes == expected else 1


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(rank_main(arguments) if arguments.workdir else launch(arguments))
