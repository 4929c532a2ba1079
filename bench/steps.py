#!/usr/bin/env python3
"""`git bisect run` vs `bisector run` on the same repo and scenario: executions and per-step overhead.

    python bench/steps.py [--repo VLLM_RELEASE_REPO] [--good v0.10.0] [--bad v0.24.0]

The repo defaults to a vLLM release repo built by bench/release_repo.py (into
~/.cache/bisector-bench/vllm-rel when missing). The scenario is a small judge script that reads the
checkout's rocm_aiter_mla.py (bad when it sizes AITER metadata without the fp8 override), so
scenario time is tiny and overhead dominates. Overhead per step = (wall - scenario time) / steps,
compared with a plain `git checkout` of the same commits in a clone.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JUDGE = """\
import pathlib, sys, time
start = time.monotonic()
path = pathlib.Path('vllm/v1/attention/backends/mla/rocm_aiter_mla.py')
text = path.read_text() if path.exists() else ''
bad = 'get_mla_metadata_info_v1' in text and 'dtypes.fp8' not in text
with open(sys.argv[1], 'a') as log:
    log.write(f"{time.monotonic() - start:.6f}\\n")
sys.exit(1 if bad else 0)
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def default_repo() -> Path:
    for candidate in (Path("/tmp/vllm-rel"), Path.home() / ".cache/bisector-bench/vllm-rel"):
        if (candidate / ".git").exists():
            return candidate
    target = Path.home() / ".cache/bisector-bench/vllm-rel"
    tool = HERE / "release_repo.py"
    subprocess.run([sys.executable, str(tool), str(target)], check=True)
    return target


def clone(source: Path, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(source), str(dest)], check=True)
    return dest


def judge_argv(workdir: Path, name: str) -> tuple[list[str], Path]:
    script = workdir / "judge.py"
    script.write_text(JUDGE)
    log = workdir / f"{name}.times"
    return [sys.executable, str(script), str(log)], log


def scenario_seconds(times: Path) -> tuple[int, float]:
    values = [float(x) for x in times.read_text().split()] if times.exists() else []
    return len(values), sum(values)


def run_git_bisect(repo: Path, good: str, bad: str, workdir: Path) -> dict:
    argv, times = judge_argv(workdir, "git")
    git(repo, "checkout", "-q", "-f", bad)
    start = time.monotonic()
    git(repo, "bisect", "start", bad, good)
    out = git(repo, "bisect", "run", *argv)
    wall = time.monotonic() - start
    culprit = next(line.split()[0] for line in out.splitlines() if "is the first bad commit" in line)
    git(repo, "bisect", "reset")
    executions, _ = scenario_seconds(times)
    # git bisect run's subprocess start is part of its scenario cost; measure judge-only time too
    return {"executions": executions, "wall": wall, "culprit": culprit}


def run_bisector(repo: Path, good: str, bad: str, workdir: Path) -> dict:
    argv, times = judge_argv(workdir, "bisector")
    result_file = workdir / "result.json"
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo), "--good", good,
                    "--bad", bad, "--build", "none", "--state-dir", str(workdir / "state"),
                    "--json", str(result_file),
                    "--", *argv], check=True, capture_output=True, cwd=HERE.parent)
    wall = time.monotonic() - start
    result = json.loads(result_file.read_text())
    step_seconds = sum(s["seconds"] for s in result["steps"])
    return {"executions": result["executions"], "wall": wall, "steps": len(result["steps"]),
            "scenario_seconds": step_seconds, "culprit": result["first_bad"]["sha"],
            "commits": [s["sha"] for s in result["steps"]]}


def plain_checkout_seconds(repo: Path, commits: list[str]) -> float:
    start = time.monotonic()
    for sha in commits:
        git(repo, "checkout", "-q", "-f", "--detach", sha)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path)
    parser.add_argument("--good", default="v0.10.0")
    parser.add_argument("--bad", default="v0.24.0")
    args = parser.parse_args()
    source = args.repo or default_repo()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        good, bad = git(source, "rev-parse", args.good), git(source, "rev-parse", args.bad)
        n = int(git(source, "rev-list", "--count", f"{good}..{bad}"))
        git_result = run_git_bisect(clone(source, tmp / "git-repo"), good, bad, tmp)
        ours = run_bisector(clone(source, tmp / "bisector-repo"), good, bad, tmp)
        plain_repo = clone(source, tmp / "plain-repo")
        git(plain_repo, "checkout", "-q", "-f", bad)
        plain = plain_checkout_seconds(plain_repo, ours["commits"])
        shutil.rmtree(tmp / "state", ignore_errors=True)
    assert git_result["culprit"] == ours["culprit"], (git_result, ours)
    overhead = (ours["wall"] - ours["scenario_seconds"]) / ours["steps"]
    checkout = plain / len(ours["commits"])
    bound = math.ceil(math.log2(n)) + 2
    print(f"range: {args.good}..{args.bad}, {n} commits; culprit {ours['culprit'][:12]} (both agree)")
    print(f"git bisect run: {git_result['executions']} executions, {git_result['wall']:.2f}s wall")
    print(f"bisector run:   {ours['executions']} executions (bound ceil(log2 N)+2 = {bound}), "
          f"{ours['wall']:.2f}s wall, {ours['scenario_seconds']:.2f}s in the scenario")
    print(f"per-step overhead: bisector {overhead:.3f}s vs plain git checkout {checkout:.3f}s "
          f"(ratio {overhead / checkout:.2f}, goal <= 1.2)")
    print(f"RESULT commits={n} git_executions={git_result['executions']} "
          f"bisector_executions={ours['executions']} bound={bound} overhead_s={overhead:.3f} "
          f"checkout_s={checkout:.3f} overhead_ratio={overhead / checkout:.2f}")


if __name__ == "__main__":
    main()
