"""Parameter-server bench: convergence of sync, async and bounded-staleness SGD with one slow
worker, throughput against the number of servers, and the effect of combining hot keys.

    python bench/ps_bench.py all --out bench/out/ps        # every run below, then table + plot
    python -m ringtree.launch -n 5 bench/ps_bench.py converge --mode ssp --staleness 2 --json out.json

The model is logistic regression over a large sparse feature space (2^20 hashed features, 16
active per sample, feature ids drawn from a Zipf law so a few keys are hot). Every worker draws
its own samples from the same generator; one worker sleeps after each step (a straggler).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

FEATURES = 1 << 20
ACTIVE = 16
ZIPF_A = 1.2


def true_weights(keys):
    from ringtree.ps import Table, initial_rows

    return initial_rows(Table("truth", dim=1, init_scale=3.0, seed=12345), keys)[:, 0]


def samples(seed, n):
    rng = np.random.default_rng(seed)
    keys = (rng.zipf(ZIPF_A, size=(n, ACTIVE)) * 2654435761) % FEATURES
    logits = true_weights(keys.reshape(-1)).reshape(n, ACTIVE).sum(1) / np.sqrt(ACTIVE)
    labels = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return keys.astype(np.int64), labels


def loss_and_grad(node, keys, labels):
    unique, inverse = np.unique(keys.reshape(-1), return_inverse=True)
    w = node.pull("w", unique)[:, 0]
    b = node.pull("b", [0])[0, 0]
    logits = w[inverse].reshape(keys.shape).sum(1) / np.sqrt(ACTIVE) + b
    p = 1 / (1 + np.exp(-logits))
    loss = float(np.mean(np.logaddexp(0, logits) - labels * logits))
    err = (p - labels) / len(labels)
    grad = np.zeros(len(unique), np.float32)
    np.add.at(grad, inverse, np.repeat(err / np.sqrt(ACTIVE), ACTIVE))
    return loss, unique, grad, float(err.sum())


def converge(args):
    import ringtree as rt
    from ringtree import ps

    comm = rt.init()
    tables = [
        ps.Table("w", dim=1, optimizer=ps.Adam(lr=0.05)),
        ps.Table("b", dim=1, rows=1, optimizer=ps.Adam(lr=0.05)),
    ]
    node = ps.start(comm, tables, num_servers=args.servers, mode=args.mode, staleness=args.staleness)
    if node.is_server:
        report = node.serve()
        return {"role": "server", "pushes": report.pushes, "died": report.died}
    me, workers = node.worker_index, node.num_workers
    eval_keys, eval_labels = samples(10**6, 2000)
    curve = []
    began = time.perf_counter()
    step = 0
    while time.perf_counter() - began < args.seconds:
        keys, labels = samples([me, step], args.batch)
        _, unique, grad, bias_grad = loss_and_grad(node, keys, labels)
        if me == workers - 1:
            time.sleep(args.slow_s)  # the straggler
        node.push("w", unique, grad[:, None])
        node.push("b", [0], np.full((1, 1), bias_grad, np.float32))
        step += 1
        if me == 0 and step % args.eval_every == 0:
            loss, *_ = loss_and_grad(node, eval_keys, eval_labels)
            updates = node.version("b")  # the bias table sees every push (sync: every step)
            per_update = args.batch * (workers if args.mode == "sync" else 1)
            curve.append({"seconds": time.perf_counter() - began, "samples": updates * per_update, "loss": loss})
    node.finish()
    return {"role": "worker", "steps": step, "curve": curve}


def throughput(args):
    import ringtree as rt
    from ringtree import ps

    comm = rt.init()
    node = ps.start(
        comm, [ps.Table("emb", dim=args.dim, optimizer=ps.SGD(lr=0.01))], num_servers=args.servers, mode="async"
    )
    if node.is_server:
        report = node.serve()
        return {"role": "server", "pushes": report.pushes, "rows": report.rows_pushed}
    node.combine = not args.no_combine
    rng = np.random.default_rng(node.worker_index)
    pushes = rows = 0
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds:
        if args.skewed:
            keys = (rng.zipf(ZIPF_A, size=args.batch) * 2654435761) % FEATURES
        else:
            keys = rng.integers(0, FEATURES, size=args.batch)
        node.pull("emb", keys)
        node.push("emb", keys, np.ones((len(keys), args.dim), np.float32))
        pushes += 1
        rows += len(keys)
    elapsed = time.perf_counter() - began
    node.finish()
    return {"role": "worker", "pushes": pushes, "rows": rows, "seconds": elapsed}


def _launch(nranks, argv, out):
    cmd = (
        [sys.executable, "-m", "ringtree.launch", "-n", str(nranks), "--timeout", "300", os.path.abspath(__file__)]
        + argv
        + ["--json", out]
    )
    subprocess.run(cmd, check=True)
    return [json.load(open(f"{out}.{r}")) for r in range(nranks)]


def run_all(args):
    os.makedirs(args.out, exist_ok=True)
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    results = {"cores": os.cpu_count(), "thp": thp, "converge": {}, "throughput": [], "skew": []}
    modes = [("sync", 0), ("async", 0), ("ssp", 2)]
    for mode, s in modes:
        ranks = _launch(
            args.servers + args.workers,
            [
                "converge",
                "--mode",
                mode,
                "--staleness",
                str(s),
                "--servers",
                str(args.servers),
                "--seconds",
                str(args.seconds),
                "--slow-s",
                str(args.slow_s),
            ],
            os.path.join(args.out, f"converge-{mode}"),
        )
        worker0 = ranks[args.servers]
        results["converge"][f"{mode}" + (f" s={s}" if mode == "ssp" else "")] = {
            "curve": worker0["curve"],
            "steps": [r["steps"] for r in ranks[args.servers :]],
        }
    for servers in (1, 2, 3):
        ranks = _launch(
            servers + args.workers,
            ["throughput", "--servers", str(servers), "--seconds", "3"],
            os.path.join(args.out, f"tp-{servers}"),
        )
        w = [r for r in ranks if r["role"] == "worker"]
        secs = max(r["seconds"] for r in w)
        results["throughput"].append(
            {
                "servers": servers,
                "workers": args.workers,
                "pushes_per_s": sum(r["pushes"] for r in w) / secs,
                "rows_per_s": sum(r["rows"] for r in w) / secs,
            }
        )
    for combine in (True, False):
        ranks = _launch(
            2 + args.workers,
            ["throughput", "--servers", "2", "--seconds", "3", "--skewed"] + ([] if combine else ["--no-combine"]),
            os.path.join(args.out, f"skew-{combine}"),
        )
        w = [r for r in ranks if r["role"] == "worker"]
        s = [r for r in ranks if r["role"] == "server"]
        secs = max(r["seconds"] for r in w)
        results["skew"].append(
            {
                "combine": combine,
                "pushes_per_s": sum(r["pushes"] for r in w) / secs,
                "rows_sent_per_push": sum(r["rows"] for r in s) / max(1, sum(r["pushes"] for r in s)),
                "server_rows": [r["rows"] for r in s],
            }
        )
    json.dump(results, open(os.path.join(args.out, "ps.json"), "w"), indent=1)
    print(report(results, args))
    plot(results, os.path.join(args.out, "ps_convergence.png"))


def report(results, args) -> str:
    lines = [
        f"{args.servers} servers, {args.workers} workers (the last sleeps {args.slow_s * 1000:.0f} ms a step), "
        f"{args.seconds} s each; {results['cores']} cores; THP {results['thp']}",
        "",
        "| mode | worker steps (fast .. straggler) | eval loss at end | samples applied at end |",
        "|---|---|---|---|",
    ]
    for mode, r in results["converge"].items():
        last = r["curve"][-1] if r["curve"] else {"loss": float("nan"), "samples": 0}
        lines.append(f"| {mode} | {' / '.join(map(str, r['steps']))} | {last['loss']:.4f} | {last['samples']} |")
    lines += ["", "| servers | workers | pushes/s | rows/s |", "|---|---|---|---|"]
    for r in results["throughput"]:
        lines.append(f"| {r['servers']} | {r['workers']} | {r['pushes_per_s']:.0f} | {r['rows_per_s']:.0f} |")
    lines += [
        "",
        "| skewed keys, combine duplicates | pushes/s | rows per push message to a server | rows per server |",
        "|---|---|---|---|",
    ]
    for r in results["skew"]:
        lines.append(
            f"| {'yes' if r['combine'] else 'no'} | {r['pushes_per_s']:.0f} | "
            f"{r['rows_sent_per_push']:.1f} | {r['server_rows']} |"
        )
    return "\n".join(lines)


def plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, r in results["converge"].items():
        c = r["curve"]
        a.plot([p["seconds"] for p in c], [p["loss"] for p in c], label=mode)
        b.plot([p["samples"] for p in c], [p["loss"] for p in c], label=mode)
    a.set_xlabel("wall time (s)")
    b.set_xlabel("samples in applied updates")
    for ax in (a, b):
        ax.set_ylabel("held-out log loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print("plot:", path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["converge", "throughput", "all"])
    p.add_argument("--mode", default="async", choices=["sync", "async", "ssp"])
    p.add_argument("--staleness", type=int, default=0)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--workers", type=int, default=3, help="all: workers per run")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--slow-s", type=float, default=0.02, help="the straggler's sleep per step")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--skewed", action="store_true")
    p.add_argument("--no-combine", action="store_true")
    p.add_argument("--json", default=None, help="rank r writes its result to JSON.r")
    p.add_argument("--out", default="bench/out/ps")
    args = p.parse_args(argv)
    if args.what == "all":
        return run_all(args)
    result = (converge if args.what == "converge" else throughput)(args)
    if args.json:
        with open(f"{args.json}.{os.environ.get('RINGTREE_RANK', '0')}", "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
