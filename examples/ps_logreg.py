"""Logistic regression on a parameter server: 1 server, the other ranks workers.

    python -m ringtree.launch -n 4 examples/ps_logreg.py [--mode sync|async|ssp] [--steps 200]

Each worker draws samples with 8 of 2^18 sparse binary features, pulls only the weights of the
features in its batch, and pushes their gradients; the server applies them with Adam. Prints
the held-out loss before and after, which must fall.
"""

import argparse

import numpy as np

import ringtree as rt
from ringtree import ps

FEATURES, ACTIVE = 1 << 18, 8


def batch(seed, n):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2000, size=(n, ACTIVE)) * 131  # 2000 distinct features in use
    truth = ps.initial_rows(ps.Table("truth", dim=1, init_scale=2.0, seed=7), keys.reshape(-1))
    logits = truth.reshape(n, ACTIVE).sum(1)
    labels = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return keys, labels


def loss_and_grad(worker, keys, labels):
    unique, inverse = np.unique(keys.reshape(-1), return_inverse=True)
    logits = worker.pull("w", unique)[inverse, 0].reshape(keys.shape).sum(1)
    loss = float(np.mean(np.logaddexp(0, logits) - labels * logits))
    grad = np.zeros((len(unique), 1), np.float32)
    np.add.at(grad[:, 0], inverse, np.repeat((1 / (1 + np.exp(-logits)) - labels) / len(labels), ACTIVE))
    return loss, unique, grad


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="ssp", choices=ps.MODES)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    comm = rt.init()
    node = ps.start(
        comm, [ps.Table("w", dim=1, optimizer=ps.Adam(lr=0.05))], num_servers=1, mode=args.mode, staleness=2
    )
    if node.is_server:
        report = node.serve()
        print(f"server: {report.pushes} pushes, {report.rows_pushed} rows in {report.seconds:.2f} s")
    else:
        held_out = batch(10**6, 2000)
        before, *_ = loss_and_grad(node, *held_out)
        for step in range(args.steps):
            _, keys, grad = loss_and_grad(node, *batch([node.worker_index, step], 128))
            node.push("w", keys, grad)
        after, *_ = loss_and_grad(node, *held_out)
        print(f"worker {node.worker_index}: held-out loss {before:.4f} -> {after:.4f} (version {node.version('w')})")
        node.finish()
        if not after < before:
            raise SystemExit("the loss did not fall")
    comm.close()


if __name__ == "__main__":
    main()
