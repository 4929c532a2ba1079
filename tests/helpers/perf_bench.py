"""A benchmark with planted slowdowns and seeded noise, for performance-hunt tests (`-- python THIS ...`).

Run in a checkout made by RepoBuilder.linear: its `state` file says good or bad; a bad commit is `--slower`
(a fraction) slower. Each run prints `BISECTOR_METRIC tok_s=VALUE` (throughput) and `latency_ms=VALUE`;
the value's noise is a pseudo-random draw from the seed, the commit's counter and the run's number (kept
per commit under --runs-dir), so the same history, seed and run order give the same samples. With
RUNS_DIR/hold-after holding N the run after N runs (of any commit) creates RUNS_DIR/held and waits; with
RUNS_DIR/hold-run holding "COUNTER RUN" that run of that commit (RUN counts from 0) creates RUNS_DIR/held and
waits until RUNS_DIR/release exists.
"""
import argparse
import fcntl
import random
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--runs-dir", required=True, type=Path)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--noise", type=float, default=0.02)      # relative standard deviation
parser.add_argument("--slower", type=float, default=0.08)     # a bad commit's slowdown
parser.add_argument("--outliers", type=float, default=0.0)    # probability of a 2x slower run
parser.add_argument("--slow-phase", type=float, default=0.0)  # probability of the machine's slow phase (H200 VM)
parser.add_argument("--phase-factor", type=float, default=1.5)  # how much slower a slow-phase run is
parser.add_argument("--file", action="store_true")            # write $BISECTOR_METRIC_FILE instead of lines
args = parser.parse_args()
# RUNS_DIR/hold-after holding N: the run after N runs (all commits) creates RUNS_DIR/held and waits to be killed
# (a file, so that the command and its environment, which the hunt's identity holds, stay the same)
hold_file = args.runs_dir / "hold-after"
hold_after = hold_file.read_text().strip() if hold_file.exists() else None

commit = Path("counter.txt").read_text().strip()
bad = Path("state").read_text().strip() == "bad"
args.runs_dir.mkdir(parents=True, exist_ok=True)
with open(args.runs_dir / f"{commit}.runs", "a+") as fh:  # this run's number for this commit
    fcntl.flock(fh, fcntl.LOCK_EX)
    fh.seek(0)
    run = len(fh.read())
    fh.write(".")
if hold_after is not None:
    with open(args.runs_dir / "all.runs", "a+") as fh:  # runs of every commit so far
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        so_far = len(fh.read())
        fh.write(".")
    if so_far == int(hold_after):
        import time
        (args.runs_dir / "held").touch()
        time.sleep(600)
hold_run = args.runs_dir / "hold-run"
if hold_run.exists() and hold_run.read_text().split() == [commit, str(run)]:
    import time
    (args.runs_dir / "held").touch()
    for _ in range(6000):  # released by the test, which gives up long before these 10 minutes
        if (args.runs_dir / "release").exists():
            break
        time.sleep(0.1)
rng = random.Random(f"{args.seed}/{commit}/{run}")
speed = 1000.0 * (1 - args.slower if bad else 1.0) * (1 + rng.gauss(0, args.noise))
if rng.random() < args.outliers:
    speed /= 2
if args.slow_phase and rng.random() < args.slow_phase:
    speed /= args.phase_factor
if args.file:
    import json
    import os
    Path(os.environ["BISECTOR_METRIC_FILE"]).write_text(json.dumps({"tok_s": speed, "latency_ms": 1e3 / speed}))
else:
    print(f"BISECTOR_METRIC tok_s={speed * 0.5:.3f}")  # an early value: the last one printed wins
    print(f"BISECTOR_METRIC tok_s={speed:.3f}")
    print(f"BISECTOR_METRIC latency_ms={1e3 / speed:.5f}")
