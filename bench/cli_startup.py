"""How long `bisector --help` takes, against the floor: a Python that only imports click.

    python bench/cli_startup.py [--runs 10] [--checkout PATH]

Prints the median and best wall time of each (fresh interpreters, runs of the two interleaved, this checkout
or --checkout PATH on PYTHONPATH) and the project modules `--help` loads. `bisector --help` imports the
command map only (bisector/cli/__init__.py); a command's module is imported when that command is asked for.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HELP = [sys.executable, "-c", "import sys; sys.argv[0] = 'bisector'; from bisector.cli import main; main()", "--help"]
CLICK = [sys.executable, "-c", "import click"]
LOADED = [sys.executable, "-c", "import sys; sys.argv = ['bisector', '--help']; from bisector.cli import main\n"
          "try:\n    main()\nexcept SystemExit:\n    pass\n"
          "print(' '.join(sorted(m for m in sys.modules if m.partition('.')[0] in ('bisector', 'scenarios'))), "
          "file=sys.stderr)"]


def timed(argv: list[str], env: dict[str, str], root: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1],
                        help="The bisector checkout to measure (default: this one).")
    arguments = parser.parse_args()
    runs, root = arguments.runs, arguments.checkout.resolve()
    # Bytecode is written (the first run) and read, as an installed bisector has it.
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    timed(HELP, env, root)  # bytecode compiled, files in the page cache
    help_times, click_times = [], []
    for _ in range(runs):  # interleaved: a load that comes and goes weighs on both alike
        help_times.append(timed(HELP, env, root))
        click_times.append(timed(CLICK, env, root))
    for label, seconds in (("bisector --help", help_times), ("python -c 'import click'", click_times)):
        print(f"{label:26} median {statistics.median(seconds):.3f}s  best {min(seconds):.3f}s  ({runs} runs)")
    extra = statistics.median(help_times) - statistics.median(click_times)
    print(f"--help over the click floor: {extra:+.3f}s")
    loaded = subprocess.run(LOADED, env=env, cwd=root, check=True, capture_output=True, text=True).stderr.split()
    print(f"project modules loaded by `bisector --help`: {len(loaded)} ({' '.join(loaded)})")


if __name__ == "__main__":
    main()
