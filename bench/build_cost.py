"""Cost model: compiles per bisection, `git bisect run` (one per step) vs `bisector run --build auto`.

Synthetic 1,000-commit history, 80 % Python-only, native changes clustered (a native commit is
followed by another with probability 0.5, as kernel PRs come with follow-ups). Each native commit
starts a new native hash. A fraction of commits has a per-commit wheel (vLLM publishes ROCm wheels per
main commit). Uses the real search (bisector.search.Bisection) with the builder's cost rule: 0 when
the hash was built before or a wheel exists, 1 for a compile. Then, on the real vLLM release repo
(if present), the distinct native hashes along main, computed from git objects.

    python bench/build_cost.py [--vllm-repo /tmp/vllm-rel] [--wheel-coverage 0.5]
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.builds.native import NATIVE_PATHS, Toolchain, native_hash  # noqa: E402
from bisector.search import Bisection, Term  # noqa: E402

COMMITS, NATIVE_SHARE, FOLLOW_UP = 1000, 0.2, 0.5


def history(rng: random.Random) -> list[int]:
    """Native hash id per commit: a Markov chain whose stationary native share is NATIVE_SHARE."""
    start = NATIVE_SHARE * (1 - FOLLOW_UP) / (1 - NATIVE_SHARE)  # P(native | previous Python-only)
    hashes, current, previous_native = [], 0, False
    for _ in range(COMMITS):
        previous_native = rng.random() < (FOLLOW_UP if previous_native else start)
        current += previous_native
        hashes.append(current)
    return hashes


def bisect(hashes: list[int], wheels: set[int], culprit: int, cost_aware: bool) -> tuple[int, int]:
    """(steps, compiles) to find culprit; cost-aware bisector verifies both endpoints first."""
    shas = [str(i) for i in range(len(hashes))]
    search = Bisection([(sha, (shas[i - 1],) if i else ()) for i, sha in enumerate(shas)], shas[-1])
    search.record(shas[0], Term.OLD)
    built: set[int] = set()
    steps = compiles = 0

    def cost(sha: str) -> float:
        i = int(sha)
        return 0.0 if hashes[i] in built or i in wheels else 1.0

    def test(i: int) -> None:
        nonlocal steps, compiles
        steps += 1
        if cost_aware:
            compiles += cost(str(i)) > 0
            built.add(hashes[i])
        else:
            compiles += 1

    if cost_aware:
        test(0)
        test(len(hashes) - 1)
    while not search.done:
        sha = search.next_probes(1, cost=cost if cost_aware else None)[0]
        test(int(sha))
        search.record(sha, Term.NEW if int(sha) >= culprit else Term.OLD)
    assert search.answer().first_new == shas[culprit]
    return steps, compiles


def model(coverage: float, runs: int, seed: int) -> tuple[float, float, float]:
    rng = random.Random(seed)
    hashes = history(rng)
    wheels = {i for i in range(COMMITS) if rng.random() < coverage}
    git_total = ours_total = steps_total = 0
    for _ in range(runs):
        culprit = rng.randrange(1, COMMITS)
        git_total += bisect(hashes, wheels, culprit, cost_aware=False)[1]
        steps, compiles = bisect(hashes, wheels, culprit, cost_aware=True)
        ours_total += compiles
        steps_total += steps
    return git_total / runs, ours_total / runs, steps_total / runs


def distinct_native_hashes(repo_path: str) -> None:
    from bisector.refs import GitRepo
    repo = GitRepo(repo_path)
    toolchain = Toolchain("7.2.1", "2.9.1", "3.12", "gfx942")
    shas = repo.git.rev_list("--first-parent", "--reverse", "main").split()
    seen: dict[str, int] = {}
    print(f"\nvLLM release repo {repo_path}: native hashes along main ({len(shas)} commits)")
    for sha in shas:
        digest = native_hash(repo.tree_ids(sha, NATIVE_PATHS), toolchain)
        fresh = digest not in seen
        seen.setdefault(digest, len(seen))
        tags = repo.git.tag("--points-at", sha).replace("\n", ",") or "-"
        print(f"  {sha[:12]} {tags:<22} native #{seen[digest]:<3} {'new' if fresh else 'same'}")
    print(f"  distinct native hashes: {len(seen)} of {len(shas)} commits")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=47276)
    parser.add_argument("--wheel-coverage", type=float, default=0.5,
                        help="share of commits with a published wheel for the RESULT line")
    parser.add_argument("--vllm-repo", default="/tmp/vllm-rel")
    args = parser.parse_args()
    hashes = history(random.Random(args.seed))
    native = sum(b != a for a, b in zip(hashes, hashes[1:]))
    print(f"synthetic history: {COMMITS} commits, {native} native changes "
          f"({100 * native / COMMITS:.0f} %), {hashes[-1] + 1} native hashes; {args.runs} culprits")
    print(f"{'wheels':>8} {'git compiles':>13} {'bisector compiles':>18} {'bisector steps':>15} {'ratio':>6}")
    for coverage in sorted({0.0, 0.25, args.wheel_coverage, 0.9}):
        git, ours, steps = model(coverage, args.runs, args.seed)
        print(f"{coverage:>7.0%} {git:>13.2f} {ours:>18.2f} {steps:>15.2f} {ours / git:>6.2f}")
    if Path(args.vllm_repo, ".git").exists():
        distinct_native_hashes(args.vllm_repo)
    git, ours, _ = model(args.wheel_coverage, args.runs, args.seed)
    print(f"RESULT git_compiles={git:.2f} bisector_compiles={ours:.2f} ratio={ours / git:.3f} "
          f"wheel_coverage={args.wheel_coverage:g}")


if __name__ == "__main__":
    main()
