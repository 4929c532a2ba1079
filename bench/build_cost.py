"""Build cost per bisection: `bisector run --build auto` against `git bisect run` as a careful user runs it.

Synthetic 1,000-commit history, 80 % Python-only, native changes clustered (a native commit is
followed by another with probability 0.5, as kernel PRs come with follow-ups). The native tree has
SOURCES translation units; a native commit edits a few of them and sometimes a shared header that
many include. A fraction of commits has a per-commit wheel (vLLM publishes ROCm wheels per main commit).

Cost is counted in full native builds (1.0 = every translation unit compiled, plus linking):
- naive `git bisect run`: a full build at every step;
- careful `git bisect run` (the baseline): VLLM_USE_PRECOMPILED=1 when the commit's wheel exists (no
  compile), else a build through ccache, which compiles only the translation units whose content no
  earlier build compiled (so at most those changed since the previous build), plus linking;
- bisector: both endpoints first, then cost-aware probes (the builder's rule: 0 when the native hash
  was built before or a wheel exists, 1 for a compile); a compile goes through ccache as above.
Both start with an empty ccache; both searches are the real one (bisector.search.dag.Bisection). Then, on the real
vLLM release repo (if present), the distinct native hashes along main, computed from git objects.

    python bench/build_cost.py [--vllm-repo /tmp/vllm-rel] [--wheel-coverage 0.5]
"""
from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.builds.native import NATIVE_PATHS, Toolchain, native_hash  # noqa: E402
from bisector.search.dag import Bisection, Term  # noqa: E402

COMMITS, NATIVE_SHARE, FOLLOW_UP = 1000, 0.2, 0.5
SOURCES = 200          # native translation units (vLLM's csrc/ has a few hundred .cu/.cpp files)
FILES_PER_CHANGE = 2   # mean translation units a native commit edits (at least one)
HEADER_SHARE = 0.15    # share of native commits that touch a shared header...
HEADER_REACH = 0.3     # ...which that share of all translation units includes
LINK_SHARE = 0.05      # configure + link + install: paid by every source build, cached or not


@dataclass
class History:
    hashes: list[int]                 # native hash id per commit (a new id at each native change)
    sources: list[tuple[int, ...]]    # per native hash id: the content version of each translation unit


def history(rng: random.Random) -> History:
    """A Markov chain whose stationary native share is NATIVE_SHARE; each native change edits files."""
    start = NATIVE_SHARE * (1 - FOLLOW_UP) / (1 - NATIVE_SHARE)  # P(native | previous Python-only)
    hashes, current, previous_native = [], 0, False
    versions = [0] * SOURCES
    sources = [tuple(versions)]
    for _ in range(COMMITS):
        previous_native = rng.random() < (FOLLOW_UP if previous_native else start)
        if previous_native:
            current += 1
            edited = 1
            while rng.random() > 1 / FILES_PER_CHANGE:
                edited += 1
            touched = set(rng.sample(range(SOURCES), min(edited, SOURCES)))
            if rng.random() < HEADER_SHARE:
                touched |= set(rng.sample(range(SOURCES), int(HEADER_REACH * SOURCES)))
            for unit in touched:
                versions[unit] += 1
            sources.append(tuple(versions))
        hashes.append(current)
    return History(hashes, sources)


class CompilerCache:
    """ccache shared by every build of one bisection: compiles only translation units never compiled."""

    def __init__(self) -> None:
        self.compiled: set[tuple[int, int]] = set()

    def build(self, versions: tuple[int, ...]) -> float:
        fresh = set(enumerate(versions)) - self.compiled
        self.compiled |= fresh
        return LINK_SHARE + (1 - LINK_SHARE) * len(fresh) / SOURCES


@dataclass
class Costs:
    steps: int = 0
    naive: float = 0.0       # git bisect run, a full build per step
    careful: float = 0.0     # git bisect run with wheels (VLLM_USE_PRECOMPILED) and ccache
    bisector: float = 0.0    # bisector run --build auto (artifact cache, wheels, ccache)
    bisector_steps: int = 0
    bisector_compiles: int = 0


def git_bisect(hist: History, wheels: set[int], culprit: int, costs: Costs) -> None:
    """Plain midpoint bisection, endpoints trusted; charges naive and careful build costs."""
    shas = [str(i) for i in range(len(hist.hashes))]
    search = Bisection([(sha, (shas[i - 1],) if i else ()) for i, sha in enumerate(shas)], shas[-1])
    search.record(shas[0], Term.OLD)
    ccache = CompilerCache()
    while not search.done:
        sha = search.next_probes(1)[0]
        i = int(sha)
        costs.steps += 1
        costs.naive += 1.0
        costs.careful += 0.0 if i in wheels else ccache.build(hist.sources[hist.hashes[i]])
        search.record(sha, Term.NEW if i >= culprit else Term.OLD)
    assert search.answer().first_new == shas[culprit]


def bisector_run(hist: History, wheels: set[int], culprit: int, costs: Costs) -> None:
    """Endpoints verified first, then cost-aware probes; builds through the artifact cache and ccache."""
    hashes = hist.hashes
    shas = [str(i) for i in range(len(hashes))]
    search = Bisection([(sha, (shas[i - 1],) if i else ()) for i, sha in enumerate(shas)], shas[-1])
    search.record(shas[0], Term.OLD)
    built: set[int] = set()
    ccache = CompilerCache()

    def cost(sha: str) -> float:
        i = int(sha)
        return 0.0 if hashes[i] in built or i in wheels else 1.0

    def test(i: int) -> None:
        costs.bisector_steps += 1
        if cost(str(i)) > 0:
            costs.bisector_compiles += 1
            costs.bisector += ccache.build(hist.sources[hashes[i]])
        built.add(hashes[i])

    test(0)
    test(len(hashes) - 1)
    while not search.done:
        sha = search.next_probes(1, cost=cost)[0]
        test(int(sha))
        search.record(sha, Term.NEW if int(sha) >= culprit else Term.OLD)
    assert search.answer().first_new == shas[culprit]


def model(coverage: float, runs: int, seed: int) -> Costs:
    """Mean costs over `runs` culprits drawn uniformly, on one history and one wheel set."""
    rng = random.Random(seed)
    hist = history(rng)
    wheels = {i for i in range(COMMITS) if rng.random() < coverage}
    total = Costs()
    for _ in range(runs):
        culprit = rng.randrange(1, COMMITS)
        git_bisect(hist, wheels, culprit, total)
        bisector_run(hist, wheels, culprit, total)
    return Costs(*(getattr(total, name) / runs for name in Costs.__dataclass_fields__))


def distinct_native_hashes(repo_path: str) -> None:
    from bisector.repo.refs import GitRepo
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
    hist = history(random.Random(args.seed))
    native = hist.hashes[-1]
    print(f"synthetic history: {COMMITS} commits, {native} native changes "
          f"({100 * native / COMMITS:.0f} %), {native + 1} native hashes, {SOURCES} translation units; "
          f"{args.runs} culprits. Cost in full native builds.")
    print(f"{'wheels':>7} {'git steps':>10} {'naive':>7} {'careful':>8} {'bisector':>9} {'(compiles)':>11} "
          f"{'vs careful':>11} {'vs naive':>9}")
    for coverage in sorted({0.0, 0.25, args.wheel_coverage, 0.9}):
        c = model(coverage, args.runs, args.seed)
        print(f"{coverage:>7.0%} {c.steps:>10.2f} {c.naive:>7.2f} {c.careful:>8.2f} {c.bisector:>9.2f} "
              f"{c.bisector_compiles:>11.2f} {c.bisector / c.careful:>11.2f} {c.bisector / c.naive:>9.2f}")
    if Path(args.vllm_repo, ".git").exists():
        distinct_native_hashes(args.vllm_repo)
    c = model(args.wheel_coverage, args.runs, args.seed)
    print(f"RESULT ratio_vs_careful={c.bisector / c.careful:.3f} ratio_vs_naive={c.bisector / c.naive:.3f} "
          f"bisector_cost={c.bisector:.2f} careful_git_cost={c.careful:.2f} naive_git_cost={c.naive:.2f} "
          f"wheel_coverage={args.wheel_coverage:g}")


if __name__ == "__main__":
    main()
