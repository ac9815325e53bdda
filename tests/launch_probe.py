"""A rank that reports what its launcher gave it (tests/test_launch.py): one JSON line with its
argv and environment; with `fail`, rank 1 exits 3 at once and rank 0 waits forever."""
import json
import os
import sys
import time

if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    if "fail" in sys.argv:
        if rank == 1:
            sys.exit(3)
        while True:
            time.sleep(1)
    print("PROBE " + json.dumps({"rank": rank, "argv": sys.argv[1:], "env": dict(os.environ)}), flush=True)
