#!/usr/bin/env python3
"""One rank of one library in its own launch; bench/launch_spread.py starts it (see rtbench/solo.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the rtbench package beside us

from rtbench.solo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
