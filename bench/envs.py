#!/usr/bin/env python3
"""`--env per-commit` figures on the real vLLM release repo.

    python bench/envs.py [--repo VLLM_RELEASE_REPO] [--ref v0.24.0] [--good v0.10.0] [--bad v0.33.0]
                         [--python PY] [--no-create]

1. Environments a bisection needs: over the first-parent commits good..bad, for every possible
   culprit, the commits a bisection tests (endpoints, then the probes of bisector's search) and the
   distinct requirement sets (environment keys) among them; printed as mean and max, beside the
   distinct sets of the whole range.
2. Creation time of one full requirement set (common + rocm, torch family dropped) over --python:
   cold (empty uv cache: every wheel downloaded), warm (uv cache filled, new environment: hard links
   only) and reuse (the stored environment found by key); and whether the base's `pip freeze` changed.

The repo defaults to a vLLM release repo built by bench/release_repo.py (as bench/steps.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from steps import default_repo  # noqa: E402  (the release repo the benches share)

from bisector.machine.envs import EnvSettings, environment_key  # noqa: E402
from bisector.repo.refs import GitRepo  # noqa: E402
from bisector.search.dag import Bisection, Term  # noqa: E402


def tested_commits(commits: list[tuple[str, tuple]], good: str, culprit_index: int) -> list[str]:
    """The commits bisector tests when commits[culprit_index] is the first bad one (one job)."""
    shas = [sha for sha, _ in commits]
    search = Bisection(commits, shas[-1])
    tested = [good, shas[-1]]
    while not search.done:
        sha = search.next_probes(1)[0]
        tested.append(sha)
        search.record(sha, Term.NEW if shas.index(sha) >= culprit_index else Term.OLD)
    return tested


def environments_needed(repo: GitRepo, store, good: str, bad: str) -> dict:
    old, new = repo.resolve(good), repo.resolve(bad)
    commits = repo.range_commits([old], new, first_parent=True)
    keys = {}
    for sha in [old] + [sha for sha, _ in commits]:
        keys[sha] = environment_key(store.requirements(lambda path, sha=sha: repo.file_text(sha, path)), store.base)
    per_bisection = [len({keys[sha] for sha in tested_commits(commits, old, culprit)})
                     for culprit in range(len(commits))]
    steps = [len(tested_commits(commits, old, culprit)) for culprit in range(len(commits))]
    return {"commits": len(commits) + 1, "range_sets": len(set(keys.values())),
            "steps_mean": round(statistics.mean(steps), 2),
            "envs_per_bisection_mean": round(statistics.mean(per_bisection), 2),
            "envs_per_bisection_max": max(per_bisection)}


def freeze(python: str) -> str:
    return subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout


def creation_times(repo: GitRepo, ref: str, python: str) -> dict:
    sha = repo.resolve(ref)
    read = lambda path: repo.file_text(sha, path)  # noqa: E731
    before = freeze(python)
    figures = {}
    with tempfile.TemporaryDirectory(prefix="bench-envs-") as tmp:
        os.environ["UV_CACHE_DIR"] = str(Path(tmp) / "uv-cache")  # cold: nothing downloaded yet
        for label, state in (("cold", "a"), ("warm", "b"), ("reuse", "b")):
            store = EnvSettings("per-commit", python).open(Path(tmp) / state)
            start = time.monotonic()
            environment = store.create(read)
            figures[f"{label}_s"] = round(time.monotonic() - start, 2)
            if not environment.ok:
                raise SystemExit(f"bench/envs.py: {environment.reason}")
            figures["requirements"] = len(environment.requirements)
            figures["dropped"] = len(environment.dropped)
        figures["installed"] = len(subprocess.run(
            [store.uv, "pip", "list", "--python", environment.python, "--format", "freeze"],
            capture_output=True, text=True).stdout.splitlines())
    figures["base_freeze_unchanged"] = freeze(python) == before
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path)
    parser.add_argument("--ref", default="v0.24.0", help="the requirement set to create")
    parser.add_argument("--good", default="v0.10.0")
    parser.add_argument("--bad", default="v0.33.0")
    parser.add_argument("--python", default=sys.executable, help="base interpreter")
    parser.add_argument("--no-create", action="store_true", help="count environments only")
    args = parser.parse_args()
    repo = GitRepo(args.repo or default_repo())
    with tempfile.TemporaryDirectory() as tmp:
        store = EnvSettings("per-commit", args.python).open(Path(tmp))
        counts = environments_needed(repo, store, args.good, args.bad)
    print(f"RESULT range={args.good}..{args.bad} " + " ".join(f"{k}={v}" for k, v in counts.items()))
    if not args.no_create:
        figures = creation_times(repo, args.ref, args.python)
        print(f"RESULT env={args.ref} " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
