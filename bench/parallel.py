"""k-way bisection wall time: rounds and seconds for K = 1, 2, 4, 8 (local), K = 4 (Ray), git bisect run.

A fixture repo of 1,000 commits; the scenario sleeps a fixed time, then judges the commit by its
counter. Endpoints are trusted (as git bisect run does). Goal: wall ≈ rounds × step, K=4 ≥ 2× K=1.

    python bench/parallel.py [--commits 1000] [--sleep 0.3] [--culprit N] [--no-ray]

--culprit defaults to the commit 63.7 % into the range; it must lie inside it (1 .. commits-1).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.engine.config import RunConfig  # noqa: E402
from bisector.engine.executor import Placement, RayExecutor, ray_runtime_env  # noqa: E402
from bisector.engine.run import run_bisection  # noqa: E402
from scenarios.command import CommandScenario  # noqa: E402

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com"}


def make_repo(path: Path, commits: int) -> list[str]:
    """A linear repo whose commit i holds counter.txt = i, written in one git fast-import."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    stream = []
    for i in range(commits):
        data = f"{i}\n".encode()
        stream.append(b"commit refs/heads/main\n")
        stream.append(f"mark :{i + 1}\ncommitter bench <bench@example.com> {1700000000 + i} +0000\n".encode())
        message = f"change {i}\n".encode()
        stream.append(b"data %d\n%s" % (len(message), message))
        if i:
            stream.append(f"from :{i}\n".encode())
        stream.append(b"M 100644 inline counter.txt\ndata %d\n%s\n" % (len(data), data))
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=b"".join(stream), check=True)
    subprocess.run(["git", "-C", str(path), "checkout", "-q", "main"], check=True)
    return subprocess.run(["git", "-C", str(path), "rev-list", "--reverse", "main"], check=True,
                          capture_output=True, text=True).stdout.split()


def engine_run(repo: Path, shas: list[str], argv: list[str], jobs: int, state: Path, executor=None):
    start = time.monotonic()
    result = run_bisection(RunConfig(repo=repo, good=shas[0], bad=shas[-1], scenario=CommandScenario(argv),
                                     jobs=jobs, state_dir=state, verify_endpoints=False, executor=executor))
    return result, time.monotonic() - start


def git_bisect_run(repo: Path, shas: list[str], argv: list[str]) -> tuple[str, int, float]:
    start = time.monotonic()
    subprocess.run(["git", "-C", str(repo), "bisect", "start", shas[-1], shas[0]], check=True,
                   capture_output=True, env=GIT_ENV)
    out = subprocess.run(["git", "-C", str(repo), "bisect", "run", *argv], check=True, capture_output=True,
                         text=True, env=GIT_ENV).stdout
    seconds = time.monotonic() - start
    culprit = subprocess.run(["git", "-C", str(repo), "rev-parse", "refs/bisect/bad"], check=True,
                             capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "-C", str(repo), "bisect", "reset"], check=True, capture_output=True, env=GIT_ENV)
    return culprit, out.count("running"), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.3)
    parser.add_argument("--culprit", type=int, help="index of the first bad commit (default: 63.7 %% in)")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    if args.commits < 2:
        parser.error("--commits: needs at least 2 (a good and a bad endpoint)")
    if args.culprit is None:
        args.culprit = min(max(1, round(args.commits * 0.637)), args.commits - 1)
    if not 1 <= args.culprit < args.commits:
        parser.error(f"--culprit {args.culprit}: must be inside the range, 1 .. {args.commits - 1}")
    argv = ["sh", "-c", f'sleep {args.sleep}; test "$(cat counter.txt)" -lt {args.culprit}']
    figures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        repo = Path(tmp) / "repo"
        shas = make_repo(repo, args.commits)
        print(f"{args.commits} commits, culprit #{args.culprit}, step = sleep {args.sleep}s; endpoints trusted")
        print(f"{'executor':<10}{'K':>3}{'rounds':>8}{'steps':>7}{'seconds':>9}{'≈ rounds×step':>15}")
        for k in (1, 2, 4, 8):
            result, seconds = engine_run(repo, shas, argv, k, Path(tmp) / f"local-{k}")
            assert result.culprit and result.culprit.sha == shas[args.culprit], result.culprit
            print(f"{'local':<10}{k:>3}{result.rounds:>8}{len(result.steps):>7}{seconds:>9.2f}"
                  f"{result.rounds * args.sleep:>15.2f}")
            figures[f"k{k}_rounds"], figures[f"k{k}_seconds"] = str(result.rounds), f"{seconds:.2f}"
        figures["speedup_k4"] = f"{float(figures['k1_seconds']) / float(figures['k4_seconds']):.2f}"
        if not args.no_ray:
            import ray
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env=ray_runtime_env())
            executor = RayExecutor(Placement(4, None, 0, 0, str(repo)), cache_dir=str(Path(tmp) / "node-cache"))
            for label, key in (("cold", "ray_k4_cold"), ("warm", "ray_k4")):
                result, seconds = engine_run(repo, shas, argv, 4, Path(tmp) / f"ray-4-{label}", executor)
                assert result.culprit and result.culprit.sha == shas[args.culprit], result.culprit
                print(f"{'ray':<10}{4:>3}{result.rounds:>8}{len(result.steps):>7}{seconds:>9.2f}"
                      f"{result.rounds * args.sleep:>15.2f}  ({label}: workers and node clone "
                      f"{'started' if label == 'cold' else 'reused'})")
                figures[f"{key}_rounds"], figures[f"{key}_seconds"] = str(result.rounds), f"{seconds:.2f}"
            ray.shutdown()
        culprit, steps, seconds = git_bisect_run(repo, shas, argv)
        assert culprit == shas[args.culprit], culprit
        print(f"{'git bisect':<10}{1:>3}{steps:>8}{steps:>7}{seconds:>9.2f}{steps * args.sleep:>15.2f}")
        figures["git_seconds"] = f"{seconds:.2f}"
    print("RESULT " + " ".join(f"{key}={value}" for key, value in figures.items()))


if __name__ == "__main__":
    main()
