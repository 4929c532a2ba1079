"""Compiles per bisection and time to culprit with per-commit images (`--image`), against `git bisect run`.

A simulation on a synthetic history (no GPU, no image is pulled): 1,000 commits, 20 % of them changing the
native sources (clustered, as kernel PRs come with follow-ups), the culprit uniform over the range. vLLM's AMD
CI does not build an image for every main commit: COVERAGE of the commits (both endpoints among them) have one.
Both searches are the real one (bisector.search.dag.Bisection); the cost weights the search sees are bisector's own
(bisector.world.world: an image here 0, one to pull PULL_COST, a fallback build FALLBACK_COST + its compile).

Minutes per step (assumptions, stated once): a ROCm source build COMPILE; a rebuild whose native inputs were
built before REBUILD (setup.py develop, every object from ccache); a pull PULL (a ~12 GB rocm/vllm-ci image);
the scenario itself RUN (the GPU scenario took about a minute a step on an H200, tests/records).
- git bisect run (the baseline, as a careful user runs it): midpoint probes, each a build then the run.
- bisector --image: commits without an image are never probed; each step a pull (once per image) then the
  run; when the window ends on commits without images the answer is that range (not exact).
- bisector --image --image-fallback build: the same, and commits without an image are built here.

    python bench/images.py [--trials 300] [--commits 1000] [--seed 7]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.search.dag import Bisection, Term  # noqa: E402
from bisector.world.world import FALLBACK_COST, PULL_COST, UNTESTABLE_COST  # noqa: E402

COMPILE, REBUILD, PULL, RUN = 45.0, 3.0, 4.0, 1.5  # minutes
NATIVE_SHARE, FOLLOW_UP = 0.2, 0.5
COVERAGES = (0.0, 0.5, 0.9)


@dataclass
class Outcome:
    compiles: int
    minutes: float
    exact: bool
    candidates: int


def native_ids(commits: int, rng: random.Random) -> list[int]:
    """A native-input id per commit: a new id at each commit that changes the native sources."""
    start = NATIVE_SHARE * (1 - FOLLOW_UP) / (1 - NATIVE_SHARE)
    ids, current, previous = [], 0, False
    for _ in range(commits):
        previous = rng.random() < (FOLLOW_UP if previous else start)
        current += previous
        ids.append(current)
    return ids


def bisect(commits: int, culprit: int, cost, step_minutes, blind=()) -> tuple[Bisection, int]:
    """The real search from verified endpoints (0 good, commits-1 bad); step_minutes(i) pays for a step."""
    shas = [str(i) for i in range(commits)]
    search = Bisection([(sha, [shas[i - 1]] if i else []) for i, sha in enumerate(shas)][1:], shas[-1])
    for i in blind:
        if 0 < i < commits - 1:
            search.record(shas[i], Term.SKIP)
    step_minutes(0)
    step_minutes(commits - 1)
    steps = 2
    while not search.done:
        (probe,) = search.next_probes(1, cost=cost)
        i = int(probe)
        step_minutes(i)
        search.record(probe, Term.NEW if i >= culprit else Term.OLD)
        steps += 1
    return search, steps


def git_bisect_run(commits: int, culprit: int, ids: list[int]) -> Outcome:
    built: set[int] = set()
    total = {"minutes": 0.0, "compiles": 0}

    def step(i: int) -> None:
        if ids[i] in built:
            total["minutes"] += REBUILD + RUN
        else:
            built.add(ids[i])
            total["minutes"] += COMPILE + RUN
            total["compiles"] += 1

    search, _ = bisect(commits, culprit, None, step)
    answer = search.answer()
    return Outcome(total["compiles"], total["minutes"], answer.first_new is not None, len(answer.candidates))


def with_images(commits: int, culprit: int, ids: list[int], imaged: set[int], fallback: bool) -> Outcome:
    built: set[int] = set()
    pulled: set[int] = set()
    total = {"minutes": 0.0, "compiles": 0}

    def cost(sha: str) -> float:  # bisector.world.world.World.cost
        i = int(sha)
        if i in imaged:
            return 0.0 if i in pulled else PULL_COST
        if not fallback:
            return UNTESTABLE_COST
        return FALLBACK_COST + (0.0 if ids[i] in built else 1.0)

    def step(i: int) -> None:
        if i in imaged:
            total["minutes"] += (0.0 if i in pulled else PULL) + RUN
            pulled.add(i)
        elif ids[i] in built:
            total["minutes"] += REBUILD + RUN
        else:
            built.add(ids[i])
            total["minutes"] += COMPILE + RUN
            total["compiles"] += 1

    blind = () if fallback else [i for i in range(commits) if i not in imaged]
    search, _ = bisect(commits, culprit, cost, step, blind)
    answer = search.answer()
    return Outcome(total["compiles"], total["minutes"], answer.first_new is not None, len(answer.candidates))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"simulation: {args.commits} commits, {args.trials} culprits per row, minutes per step: compile "
          f"{COMPILE:g}, rebuild {REBUILD:g}, pull {PULL:g}, run {RUN:g}")
    print(f"{'image coverage':>14}  {'strategy':<38} {'compiles':>9} {'hours':>7} {'exact':>6} {'candidates':>10}")
    trials = []
    for _ in range(args.trials):
        ids = native_ids(args.commits, rng)
        culprit = rng.randrange(1, args.commits)
        trials.append((ids, culprit, rng.random()))
    for coverage in COVERAGES:
        rows: dict[str, list[Outcome]] = {"git bisect run (build every step)": [],
                                          "bisector --image": [], "bisector --image --image-fallback build": []}
        for n, (ids, culprit, _) in enumerate(trials):
            pick = random.Random(n * 7919 + int(coverage * 100))
            imaged = {i for i in range(args.commits) if pick.random() < coverage} | ({0, args.commits - 1}
                                                                                      if coverage else set())
            rows["git bisect run (build every step)"].append(git_bisect_run(args.commits, culprit, ids))
            if coverage:
                rows["bisector --image"].append(with_images(args.commits, culprit, ids, imaged, False))
            rows["bisector --image --image-fallback build"].append(
                with_images(args.commits, culprit, ids, imaged, True))
        for name, outcomes in rows.items():
            if not outcomes:
                continue
            print(f"{coverage:>13.0%}  {name:<38} {statistics.mean(o.compiles for o in outcomes):>9.1f} "
                  f"{statistics.mean(o.minutes for o in outcomes) / 60:>7.1f} "
                  f"{sum(o.exact for o in outcomes) / len(outcomes):>6.0%} "
                  f"{statistics.mean(o.candidates for o in outcomes):>10.1f}")


if __name__ == "__main__":
    main()
