"""A seeded intermittent GPU fault, for tests and benches: run in a checkout as a command scenario.

Bad commits (their `state` file says bad) fault with probability FLAKY_P (default 0.3); any run also
fails falsely with probability FLAKY_FALSE (default 0: good commits never fail). Each run draws from
Random(FLAKY_SEED, commit, attempt), the attempt counted per commit in FLAKY_COUNTER_DIR, so a whole
bisection replays exactly for a given seed.
"""
import os
import pathlib
import random
import subprocess
import sys

sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
counter = pathlib.Path(os.environ["FLAKY_COUNTER_DIR"]) / sha
attempt = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(attempt + 1))
rng = random.Random(f"{os.environ.get('FLAKY_SEED', '0')}/{sha}/{attempt}")
faulty = pathlib.Path("state").read_text().strip() == "bad"
if rng.random() < float(os.environ.get("FLAKY_FALSE", "0")):
    print("RuntimeError: NCCL timeout (a failure that is not the fault)", file=sys.stderr)
    sys.exit(1)
if faulty and rng.random() < float(os.environ.get("FLAKY_P", "0.3")):
    print("Memory access fault by GPU node-2 (Agent handle: 0x5a5a) on address 0x7f0000001000. "
          "Reason: Page not present or supervisor privilege.", file=sys.stderr)
    sys.exit(134)
print("graph capture finished")
