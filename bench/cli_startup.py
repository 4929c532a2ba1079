"""How long `bisector --help` takes, against the floor: a Python that only imports click.

    python bench/cli_startup.py [--runs 10]

Prints the median and best wall time of each (fresh interpreters, this checkout on PYTHONPATH) and the
project modules `--help` loads. The commands import the engine, git, scenarios and reports when they run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Bytecode is written (the first run) and read, as an installed bisector has it.
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
HELP = [sys.executable, "-c", "import sys; sys.argv[0] = 'bisector'; from bisector.cli import main; main()", "--help"]
CLICK = [sys.executable, "-c", "import click"]
LOADED = [sys.executable, "-c", "import sys; import bisector.cli; "
          "print(' '.join(sorted(m for m in sys.modules if m.partition('.')[0] in ('bisector', 'scenarios'))))"]


def timed(argv: list[str], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=ENV, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    timed(HELP, 1)  # bytecode compiled, files in the page cache
    help_times, click_times = timed(HELP, runs), timed(CLICK, runs)
    for label, seconds in (("bisector --help", help_times), ("python -c 'import click'", click_times)):
        print(f"{label:26} median {statistics.median(seconds):.3f}s  best {min(seconds):.3f}s  ({runs} runs)")
    extra = statistics.median(help_times) - statistics.median(click_times)
    print(f"--help over the click floor: {extra:+.3f}s")
    loaded = subprocess.run(LOADED, env=ENV, cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    print(f"project modules loaded by the command line: {len(loaded)} ({' '.join(loaded)})")


if __name__ == "__main__":
    main()
