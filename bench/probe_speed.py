#!/usr/bin/env python3
"""Time aiter-mla-probe on every tag of a vLLM release repo (built by bench/release_repo.py).

    python bench/probe_speed.py /tmp/vllm-rel [--ref v0.19.0 ...] [--option heads=16 ...]

Each ref's `vllm/` tree is exported with `git archive` (the repo is only read). Prints one row per ref
(verdict, wall seconds, CPU seconds of the probe process, reason), then `RESULT key=value ...`.
CPU seconds are what the probe costs on an otherwise idle machine; wall seconds include contention.
"""
from __future__ import annotations

import argparse
import io
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.repo.archives import extract  # noqa: E402
from scenarios.aiter_mla_probe import AiterMLAProbe  # noqa: E402
from scenarios.base import StepContext  # noqa: E402


def version_key(ref: str) -> tuple:
    """v0.24.0 < fix-47276 < v0.25.0: the fix tag sorts just after v0.24.0."""
    if ref.startswith("v"):
        return tuple(int(part) for part in ref[1:].split("."))
    return (0, 24, 0, 0, 1)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def export(repo: Path, ref: str, dest: Path) -> None:
    data = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", ref, "vllm"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        extract(tar, dest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--ref", action="append", help="ref to probe (default: every tag)")
    parser.add_argument("--option", action="append", default=[], help="scenario option KEY=VALUE")
    args = parser.parse_args()
    refs = args.ref or sorted(subprocess.run(["git", "-C", str(args.repo), "tag"], check=True,
                                             capture_output=True, text=True).stdout.split(),
                              key=version_key)
    scenario = AiterMLAProbe(dict(option.split("=", 1) for option in args.option))
    seconds, cpu_seconds, verdicts = [], [], {"good": 0, "bad": 0, "skip": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for ref in refs:
            checkout = Path(tmp) / ref
            export(args.repo, ref, checkout)
            start, cpu_start = time.monotonic(), children_cpu()
            outcome = scenario.run(StepContext(checkout=checkout, log_path=Path(tmp) / f"{ref}.log",
                                               python=sys.executable))
            seconds.append(time.monotonic() - start)
            cpu_seconds.append(children_cpu() - cpu_start)
            verdicts[outcome.verdict.value] += 1
            print(f"{ref:<12} {outcome.verdict.value:<5} {seconds[-1]:5.2f}s {cpu_seconds[-1]:5.2f}s cpu  "
                  f"{outcome.reason}", flush=True)
    print(f"RESULT refs={len(refs)} good={verdicts['good']} bad={verdicts['bad']} skip={verdicts['skip']} "
          f"max_seconds={max(seconds):.2f} mean_seconds={sum(seconds) / len(seconds):.2f} "
          f"max_cpu_seconds={max(cpu_seconds):.2f} mean_cpu_seconds={sum(cpu_seconds) / len(cpu_seconds):.2f} "
          f"options={','.join(args.option) or 'default'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
