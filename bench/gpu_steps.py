"""Per-step GPU times of two bisections of the same planted history, side by side (H200 records).

    python bench/gpu_steps.py [BEFORE.json AFTER.json [NUMERICS.json]]

Defaults: tests/records/h200-bisect-final.json (fresh temp model dir per step: vLLM compiled every time),
h200-bisect-compile-cache.json (the shared model dir and compile cache) and h200-bisect-numerics.json
(check=numerics on the silent history: two engines a step). Prints each step's verdict, wall seconds,
torch.compile seconds and cache hit where the step recorded them, and the totals.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "records"
DEFAULTS = ("h200-bisect-final.json", "h200-bisect-compile-cache.json", "h200-bisect-numerics.json")


def rows(run: dict) -> list[str]:
    lines = []
    for n, step in enumerate(run["steps"], 1):
        compiled = step["details"].get("compile", {})
        reference = step["details"].get("reference", {}).get("compile", {})
        seconds = compiled.get("compile_seconds")
        extra = f"  reference compile {reference.get('compile_seconds')} s" if reference else ""
        lines.append(f"  {n}  {step['sha'][:12]}  {step['verdict']:<5} {step['seconds']:6.1f} s  compile "
                     f"{'-' if seconds is None else f'{seconds:.2f} s':>7}  hit {compiled.get('cache_hit', '-')}"
                     f"{extra}")
    total = sum(step["seconds"] for step in run["steps"])
    lines.append(f"  total {total:.0f} s over {len(run['steps'])} steps; culprit {run['culprit']['sha'][:12]}")
    return lines


def main(argv: list[str]) -> None:
    paths = [Path(arg) for arg in argv] or [RECORDS / name for name in DEFAULTS]
    for path in paths:
        run = json.loads(path.read_text())
        print(f"{path.name}: {' '.join(run.get('command_line') or [])}")
        print("\n".join(rows(run)))


if __name__ == "__main__":
    main(sys.argv[1:])
