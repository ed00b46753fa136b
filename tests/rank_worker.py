"""Entry point of one rank in a test world: rank_worker.py MODULE FUNC JSON_ARGS OUTDIR."""
import importlib
import json
import os
import sys

if __name__ == "__main__":
    module, func, args, outdir = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    result = getattr(importlib.import_module(module), func)(**args)
    slot = int(os.environ.get("RINGTREE_TEST_SLOT", os.environ.get("RINGTREE_RANK", "0")))
    with open(os.path.join(outdir, f"{slot}.json.tmp"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(outdir, f"{slot}.json.tmp"), os.path.join(outdir, f"{slot}.json"))
