"""Entry point of one rank in a test world: rank_worker.py FUNC JSON_ARGS OUTDIR."""
import json
import os
import sys

import workers

if __name__ == "__main__":
    func, args, outdir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    result = getattr(workers, func)(**args)
    rank = int(os.environ.get("RINGTREE_TEST_SLOT", os.environ.get("RINGTREE_RANK", "0")))
    with open(os.path.join(outdir, f"{rank}.json.tmp"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(outdir, f"{rank}.json.tmp"), os.path.join(outdir, f"{rank}.json"))
