"""Torch test worlds: harness.run_world with the rank functions of torch_workers.py."""
import harness


def run_torch_world(nranks, func, args=None, **options):
    return harness.run_world(nranks, func, args, module="torch_workers", **options)
