"""Performance hunts under noise: right, wrong and skipped answers and total runs, over many seeds, for
bisector's adaptive hunt (the real PerfPolicy over the real Bisection) against a fixed-repeat strategy.

Synthetic linear history of --commits commits; from a random culprit on, the metric (a throughput) is
--slowdown lower. Each run's value is 1000 x (1 - slowdown if slow) x (1 + N(0, --noise)), and with
probability --outliers it is halved (a 2x slow outlier: a busy machine); with probability --slow-phase the
machine is in its slow phase for that run, --phase-factor slower (what the H200's VM did to the GPU scenario's
CPU-bound decode in round 6: a 2.1 ms step or a ~3.2 ms one, about half the engine starts each). Seeded per hunt.

- adaptive: `bisector run --metric M --higher-is-better` as it runs (PerfPolicy: endpoints first, Pinpoint's
  comparison, more samples only while a commit is undecided, skips at the cap, endpoint repeats interleaved);
- fixed: --fixed-repeat runs of each end and of each probe, a probe bad when its median is nearer the bad
  end's median (what a script around `git bisect run` does).

- oracle: a reference, the least a hunt can cost: the ends' runs, then each probe by a sequential test that
  knows the true means, noise and outliers (error 1e-4 per probe); nothing it does is estimated.
- ends known (--goal): a reference, the adaptive hunt with each end known from 40 runs of which only its first
  5 are counted: what the probes cost by bisector's own rules when the ends need no estimating.

A hunt is right when it names the culprit, wrong when it names another commit, and skip when it names none
(inconclusive, or the endpoints not found to differ).

    python bench/perf_noise.py [--seeds 50] [--noise 0.03] [--slowdown 0.08] [--outliers 0.05]
    python bench/perf_noise.py --goal --seeds 300      # every setting of the goal, and whether it is met
    python bench/perf_noise.py --noise 0.01 --slowdown 0.06 --slow-phase 0.5 --phase-factor 1.5   # the H200's VM
    python bench/perf_noise.py --noise 0.03 --slow-phase 0.5 --replay 109   # one seed's hunt, probe by probe
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.errors import EndpointError  # noqa: E402
from bisector.record.store import Execution  # noqa: E402
from bisector.seams import Verdict  # noqa: E402
from bisector.search.dag import Bisection, Term  # noqa: E402
from bisector.search.perf import Direction, PerfSettings  # noqa: E402
from bisector.search.policies import Endpoints, PerfPolicy  # noqa: E402


class Bench:
    """One seeded history: the culprit's index and a sampler of runs."""

    def __init__(self, seed: int, commits: int, noise: float, slowdown: float, outliers: float,
                 slow_phase: float = 0.0, phase_factor: float = 1.5):
        self.rng = random.Random(seed)
        self.shas = [f"c{i:04d}" for i in range(commits)]
        self.culprit = self.rng.randrange(1, commits)
        self.noise, self.slowdown, self.outliers = noise, slowdown, outliers
        self.slow_phase, self.phase_factor = slow_phase, phase_factor
        self.runs = 0

    def run(self, sha: str) -> float:
        self.runs += 1
        slow = self.shas.index(sha) >= self.culprit
        value = 1000 * (1 - self.slowdown if slow else 1) * (1 + self.rng.gauss(0, self.noise))
        if self.slow_phase and self.rng.random() < self.slow_phase:  # the machine's slow phase (the H200's VM)
            value /= self.phase_factor
        return value / 2 if self.rng.random() < self.outliers else value


def adaptive(bench: Bench, max_samples: int) -> str | None:
    """bisector's hunt; the culprit it names, or None."""
    return hunt(bench, max_samples)[1]


def known_ends(bench: Bench, max_samples: int, runs: int = 40) -> str | None:
    """A reference: bisector's hunt with each end known from `runs` runs, of which only the hunt's own first
    (ENDPOINT_START each) are counted. What the probes cost when the ends need no estimating."""
    return hunt(bench, max_samples, known=runs)[1]


def hunt(bench: Bench, max_samples: int, known: int = 0) -> tuple[PerfPolicy, str | None, str | None]:
    """bisector's hunt: the policy as it ended, the culprit it names (or None) and why it stopped (or None).
    known: each end starts with that many runs, not counted beyond the hunt's first (`known_ends`)."""
    history: dict[str, list[Execution]] = {sha: [] for sha in bench.shas}
    if known:
        for sha in (bench.shas[0], bench.shas[-1]):
            history[sha] = [Execution(sha, Verdict.GOOD, "exit 0", None, 0.0, None, {},
                                      metrics={"tok_s": bench.run(sha)}) for _ in range(known)]
        bench.runs = 2 * PerfSettings.ENDPOINT_START  # only the hunt's own first runs of the ends count
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
    except EndpointError as stopped:
        return policy, None, str(stopped)
    return policy, policy.answer().first_new, None


def replay(bench: Bench, max_samples: int) -> None:
    """One seed's hunt, told: each probe in the order it was decided, its runs, the truth, its verdict and why;
    the ends' runs; what it named."""
    policy, found, stopped = hunt(bench, max_samples)
    culprit = bench.shas[bench.culprit]
    for sha in policy.tested:
        end, reason = policy.verdicts[sha]
        truth = "bad" if bench.shas.index(sha) >= bench.culprit else "good"
        print(f"{sha} ({truth}) {[round(value) for value in policy.samples(sha)]}\n  -> {end or 'skip'}: {reason}")
    for name, sha in (("good end", bench.shas[0]), ("bad end", bench.shas[-1])):
        print(f"{name} {sorted(round(value) for value in policy.samples(sha))}")
    named = stopped or f"named {found}"
    print(f"{named}; the culprit is {culprit}: {'right' if found == culprit else 'skip' if found is None else 'WRONG'}"
          f", {bench.runs} runs")


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


def oracle(bench: Bench, error: float = 1e-4) -> str | None:
    """A reference, not a strategy anyone can run: the ends' first runs as bisector's (ENDPOINT_START each),
    then each probe sampled until Wald's sequential likelihood-ratio test passes log(1 / error), with the true
    means, noise and outlier model (scipy.stats.norm). What a hunt costs when nothing has to be estimated."""
    import math

    from scipy import stats

    for _ in range(PerfSettings.ENDPOINT_START):
        bench.run(bench.shas[0]), bench.run(bench.shas[-1])

    def log_like(value: float, mean: float) -> float:
        spread = mean * bench.noise
        return math.log((1 - bench.outliers) * stats.norm.pdf(value, mean, spread)
                        + bench.outliers * stats.norm.pdf(value, mean / 2, spread / 2))

    commits = [(sha, [bench.shas[i - 1]] if i else []) for i, sha in enumerate(bench.shas)][1:]
    search = Bisection(commits, bench.shas[-1])
    while not search.done:
        sha, ratio = search.next_probes(1)[0], 0.0
        while abs(ratio) < math.log(1 / error):
            value = bench.run(sha)
            ratio += log_like(value, 1000 * (1 - bench.slowdown)) - log_like(value, 1000)
        search.record(sha, Term.NEW if ratio > 0 else Term.OLD)
    return search.answer().first_new


# The settings issue 35's goal is stated for: (noise, slowdown, outliers).
GOAL_SETTINGS = ((0.03, 0.08, 0.0), (0.03, 0.08, 0.05), (0.03, 0.08, 0.10), (0.02, 0.05, 0.0))


def tally(hunt, seeds: int, commits: int, noise: float, slowdown: float, outliers: float,
          phases: tuple[float, float] = (0.0, 1.5)) -> dict:
    """right / wrong / skip counts and total runs of one strategy over seeds, and the seeds it was wrong on."""
    counts = {"right": 0, "wrong": 0, "skip": 0, "runs": 0, "wrong_seeds": []}
    for seed in range(seeds):
        bench = Bench(seed, commits, noise, slowdown, outliers, *phases)
        found = hunt(bench)
        verdict = "skip" if found is None else "right" if found == bench.shas[bench.culprit] else "wrong"
        counts[verdict] += 1
        counts["runs"] += bench.runs
        if verdict == "wrong":
            counts["wrong_seeds"].append(seed)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--commits", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--slowdown", type=float, default=0.08)
    parser.add_argument("--outliers", type=float, default=0.0)
    parser.add_argument("--goal", action="store_true",
                        help="every setting of issue 35's goal (3 %%/8 %% with 0, 5 and 10 %% outliers; 2 %%/5 %%)")
    parser.add_argument("--slow-phase", type=float, default=0.0,
                        help="the chance that a run finds the machine in its slow phase (the H200's VM: ~0.5)")
    parser.add_argument("--phase-factor", type=float, default=1.5,
                        help="how much slower the slow phase is (the H200's VM: a 2.1 ms step became ~3.2 ms)")
    parser.add_argument("--max-samples", type=int, default=20)
    parser.add_argument("--fixed-repeat", type=int, default=10)
    parser.add_argument("--replay", type=int, metavar="SEED",
                        help="tell one seed's adaptive hunt: each probe's runs, verdict and why")
    args = parser.parse_args()
    if args.replay is not None:
        replay(Bench(args.replay, args.commits, args.noise, args.slowdown, args.outliers, args.slow_phase,
                     args.phase_factor), args.max_samples)
        return
    settings = GOAL_SETTINGS if args.goal else ((args.noise, args.slowdown, args.outliers),)
    phases = (0.0, args.phase_factor) if args.goal else (args.slow_phase, args.phase_factor)
    print(f"{args.seeds} seeds, {args.commits} commits; goal: the adaptive hunt in at most half of fixed "
          f"x{args.fixed_repeat}'s runs, as many right answers, no wrong one" +
          (f"; slow phase in {phases[0]:.0%} of runs, {phases[1]}x slower" if phases[0] else ""))
    print(f"{'noise, slowdown, outliers':<26} {'strategy':<10} {'right':>6} {'wrong':>6} {'skip':>5} "
          f"{'runs/hunt':>10} {'vs fixed':>9}  goal")
    for noise, slowdown, outliers in settings:
        label = f"{noise:.0%}, {slowdown:.0%}, {outliers:.0%}"
        fixed_counts = tally(lambda bench: fixed(bench, args.fixed_repeat), args.seeds, args.commits, noise,
                             slowdown, outliers, phases)
        ours = tally(lambda bench: adaptive(bench, args.max_samples), args.seeds, args.commits, noise, slowdown,
                     outliers, phases)
        # the oracle's model has no slow phase: it is no reference there
        known = tally(oracle, args.seeds, args.commits, noise, slowdown, outliers) if not phases[0] else None
        ends_known = tally(lambda bench: known_ends(bench, args.max_samples), args.seeds, args.commits, noise,
                           slowdown, outliers, phases) if args.goal else None
        share = ours["runs"] / fixed_counts["runs"]
        missed = [why for why, failed in (("runs", share > 0.5), ("right", ours["right"] < fixed_counts["right"]),
                                          ("wrong", ours["wrong"] > 0)) if failed]
        for name, counts in ((f"fixed x{args.fixed_repeat}", fixed_counts), ("adaptive", ours),
                             *((("ends known", ends_known),) if ends_known else ()),
                             *((("oracle", known),) if known else ())):
            mark = "" if name != "adaptive" else "met" if not missed else "missed: " + ", ".join(missed)
            wrong = f" (seeds {', '.join(map(str, counts['wrong_seeds'][:5]))})" if counts["wrong"] and mark else ""
            print(f"{label:<26} {name:<10} {counts['right']:>6} {counts['wrong']:>6} {counts['skip']:>5} "
                  f"{counts['runs'] / args.seeds:>10.1f} {counts['runs'] / fixed_counts['runs']:>9.0%}  {mark}{wrong}")


if __name__ == "__main__":
    main()
