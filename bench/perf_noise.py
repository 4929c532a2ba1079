"""Performance hunts under noise: right, wrong and skipped answers and total runs, over many seeds, for
bisector's adaptive hunt (the real PerfPolicy over the real Bisection) against a fixed-repeat strategy.

Synthetic linear history of --commits commits; from a random culprit on, the metric (a throughput) is
--slowdown lower. Each run's value is 1000 x (1 - slowdown if slow) x (1 + N(0, --noise)), and with
probability --outliers it is halved (a 2x slow outlier: a busy machine). Seeded per hunt.

- adaptive: `bisector run --metric M --higher-is-better` as it runs (PerfPolicy: endpoints first, Pinpoint's
  comparison, more samples only while a commit is undecided, skips at the cap, endpoint repeats interleaved);
- fixed: --fixed-repeat runs of each end and of each probe, a probe bad when its median is nearer the bad
  end's median (what a script around `git bisect run` does).

A hunt is right when it names the culprit, wrong when it names another commit, and skip when it names none
(inconclusive, or the endpoints not found to differ).

    python bench/perf_noise.py [--seeds 50] [--noise 0.03] [--slowdown 0.08] [--outliers 0.05]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.errors import EndpointError  # noqa: E402
from bisector.perf import Direction, PerfSettings  # noqa: E402
from bisector.policies import Endpoints, PerfPolicy  # noqa: E402
from bisector.seams import Verdict  # noqa: E402
from bisector.search import Bisection, Term  # noqa: E402
from bisector.store import Execution  # noqa: E402


class Bench:
    """One seeded history: the culprit's index and a sampler of runs."""

    def __init__(self, seed: int, commits: int, noise: float, slowdown: float, outliers: float):
        self.rng = random.Random(seed)
        self.shas = [f"c{i:04d}" for i in range(commits)]
        self.culprit = self.rng.randrange(1, commits)
        self.noise, self.slowdown, self.outliers = noise, slowdown, outliers
        self.runs = 0

    def run(self, sha: str) -> float:
        self.runs += 1
        slow = self.shas.index(sha) >= self.culprit
        value = 1000 * (1 - self.slowdown if slow else 1) * (1 + self.rng.gauss(0, self.noise))
        return value / 2 if self.rng.random() < self.outliers else value


def adaptive(bench: Bench, max_samples: int) -> str | None:
    """bisector's hunt; the culprit it names, or None."""
    history: dict[str, list[Execution]] = {sha: [] for sha in bench.shas}
    commits = [(sha, [bench.shas[i - 1]] if i else []) for i, sha in enumerate(bench.shas)][1:]
    ends = Endpoints(old=bench.shas[0], new=bench.shas[-1], old_name="good", new_name="bad",
                     old_ref="good", new_ref="bad")
    policy = PerfPolicy(Bisection(commits, ends.new), ends,
                        PerfSettings("tok_s", Direction.HIGHER, 0.01, 0, max_samples), history.__getitem__)
    batches = policy.batches()
    try:
        batch = next(batches, None)
        while batch is not None:
            for sha, _ in batch.commits:
                history[sha].append(Execution(sha, Verdict.GOOD, "exit 0", None, 0.0, None, {},
                                              metrics={"tok_s": bench.run(sha)}))
            try:
                batch = batches.send([])
            except StopIteration:
                batch = None
    except EndpointError:
        return None
    return policy.answer()[0].first_new


def fixed(bench: Bench, repeat: int) -> str | None:
    """A fixed number of runs per commit, a probe's median against the midpoint of the ends'."""
    good = statistics.median(bench.run(bench.shas[0]) for _ in range(repeat))
    bad = statistics.median(bench.run(bench.shas[-1]) for _ in range(repeat))
    commits = [(sha, [bench.shas[i - 1]] if i else []) for i, sha in enumerate(bench.shas)][1:]
    search = Bisection(commits, bench.shas[-1])
    while not search.done:
        sha = search.next_probes(1)[0]
        median = statistics.median(bench.run(sha) for _ in range(repeat))
        search.record(sha, Term.OLD if abs(median - good) < abs(median - bad) else Term.NEW)
    return search.answer().first_new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--commits", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--slowdown", type=float, default=0.08)
    parser.add_argument("--outliers", type=float, default=0.0)
    parser.add_argument("--max-samples", type=int, default=20)
    parser.add_argument("--fixed-repeat", type=int, default=10)
    args = parser.parse_args()
    print(f"{args.seeds} seeds, {args.commits} commits, noise {args.noise:.0%}, slowdown {args.slowdown:.0%}, "
          f"outliers {args.outliers:.0%}")
    print(f"{'strategy':<12} {'right':>6} {'wrong':>6} {'skip':>6} {'runs/hunt':>10} {'vs fixed':>9}")
    totals = []
    for name, hunt in ((f"fixed x{args.fixed_repeat}", lambda bench: fixed(bench, args.fixed_repeat)),
                       ("adaptive", lambda bench: adaptive(bench, args.max_samples))):
        tally = {"right": 0, "wrong": 0, "skip": 0}
        runs = 0
        for seed in range(args.seeds):
            bench = Bench(seed, args.commits, args.noise, args.slowdown, args.outliers)
            found = hunt(bench)
            tally["skip" if found is None else "right" if found == bench.shas[bench.culprit] else "wrong"] += 1
            runs += bench.runs
        totals.append(runs)
        print(f"{name:<12} {tally['right']:>6} {tally['wrong']:>6} {tally['skip']:>6} {runs / args.seeds:>10.1f} "
              f"{runs / totals[0]:>9.0%}")


if __name__ == "__main__":
    main()
