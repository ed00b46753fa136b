"""Entry point of one rank in a test world: rank_worker.py FILE QUALNAME JSON_ARGS [OUTDIR].

Loads the module at FILE under its file name (the harness puts its folder first on the import
path, so it finds its sibling modules as the test did), calls QUALNAME in it with JSON_ARGS as keyword arguments and,
given OUTDIR, writes the JSON result to OUTDIR/<slot>.json. With RINGTREE_TEST_STANDIN=1 the rank
runs ringtree over the CUDA stand-in (standin.py). Without OUTDIR (a launcher such as
mpiexec or torchrun started the rank) the exit status and output are all that count.
"""

import importlib.util
import json
import os
import sys


def load(path):
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a sibling that imports it by name gets this very module
    spec.loader.exec_module(module)
    return module


def find(module, qualname):
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


if __name__ == "__main__":
    if os.environ.get("RINGTREE_TEST_STANDIN") == "1":
        import standin  # this folder: ringtree's core over the CUDA stand-in, before ringtree loads

        standin.install()
    path, qualname, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    outdir = sys.argv[4] if len(sys.argv) > 4 else None
    result = find(load(path), qualname)(**args)
    if outdir is not None:
        slot = int(os.environ.get("RINGTREE_TEST_SLOT", os.environ.get("RINGTREE_RANK", "0")))
        with open(os.path.join(outdir, f"{slot}.json.tmp"), "w") as f:
            json.dump(result, f)
        os.replace(os.path.join(outdir, f"{slot}.json.tmp"), os.path.join(outdir, f"{slot}.json"))
