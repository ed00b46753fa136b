#!/usr/bin/env python3
"""One rank of one library in its own launch; bench/launch_spread.py starts it (see rtbench/solo.py)."""

import sys

from rtbench.solo import main

if __name__ == "__main__":
    sys.exit(main())
