"""A rank that reports what its launcher gave it (tests/integration/test_launch.py): `launch_probe.py OUT_DIR
flags...` writes its argv, environment, working directory, first import path and torch's thread
count as JSON to OUT_DIR/rank<RANK>.json (a file of its own: lines the ranks print to one shared
stdout can interleave); with `fail PID_FILE`, rank 0 writes its pid and waits forever, and rank 1
then says so on stderr and exits 3."""
import json
import os
import sys
import time

if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    if sys.argv[-2] == "fail":  # fail PID_FILE: rank 0 writes its pid there, then rank 1 fails
        pid_file = sys.argv[-1]
        if rank == 1:
            while not os.path.exists(pid_file):
                time.sleep(0.05)
            print("rank 1 exits with 3", file=sys.stderr)
            sys.exit(3)
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        while True:
            time.sleep(1)
    import torch
    out_dir = sys.argv[2]  # after --local_rank=i
    with open(os.path.join(out_dir, f"rank{rank}.json.tmp"), "w") as f:
        json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "path0": sys.path[0],
                   "threads": torch.get_num_threads()}, f)
    os.rename(os.path.join(out_dir, f"rank{rank}.json.tmp"), os.path.join(out_dir, f"rank{rank}.json"))
