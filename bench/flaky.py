"""Intermittent fault: --flaky posterior search versus plain bisection with --repeat N.

Simulated in-process over the pure searches (the same classes the engine drives): a linear range of
COMMITS, a uniformly drawn culprit, bad commits faulting with probability P per run, seeded per trial.
Executions count every scenario run the search asks for (endpoint checks excluded for both).
--flaky runs at `bisector run --flaky`'s own defaults (--confidence, --max-runs-per-commit,
--fault-rate), read from the CLI's options, and learns a false-failure rate as the CLI does (without the
clean end's runs, which the endpoint checks make: bench/flaky_false.py counts those).

    PYTHONPATH=. python bench/flaky.py [--trials 100] [--p 0.3] [--commits 64]
"""
import argparse
import random

from bisector.cli import main as cli
from bisector.search.dag import Bisection, FlakyBisection, FlakyModel, Term

# `bisector run`'s option values when none is given on the command line, as click resolves them.
RUN_DEFAULTS = cli.get_command(None, "run").make_context("run", [], resilient_parsing=True).params


def plain(commits: list[str], culprit: int, p: float, repeat: int, rng: random.Random) -> tuple[bool, int]:
    search = Bisection([(sha, (commits[i - 1],) if i else ()) for i, sha in enumerate(commits)], commits[-1])
    runs = 0
    while not search.done:
        sha = search.next_probes(1)[0]
        faulted = False
        for _ in range(repeat):
            runs += 1
            if commits.index(sha) >= culprit and rng.random() < p:
                faulted = True
                break
        search.record(sha, Term.NEW if faulted else Term.OLD)
    return search.answer().first_new == commits[culprit], runs


def flaky(commits: list[str], culprit: int, p: float, rng: random.Random) -> tuple[bool, int, float]:
    search = FlakyBisection(commits, "old", model=FlakyModel(
        fault_rate=RUN_DEFAULTS["fault_rate"], confidence=RUN_DEFAULTS["confidence"],
        max_runs_per_commit=RUN_DEFAULTS["max_runs_per_commit"], false_failures=True))
    runs = 0
    while not search.done:
        sha = search.next_probes(1)[0]
        runs += 1
        search.record(sha, sha != "old" and commits.index(sha) >= culprit and rng.random() < p)
    best, conf = search.best()
    return best == commits[culprit], runs, conf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--p", type=float, default=0.3)
    ap.add_argument("--commits", type=int, default=64)
    args = ap.parse_args()
    commits = [f"c{i}" for i in range(args.commits)]
    culprits = [random.Random(seed).randrange(args.commits) for seed in range(args.trials)]
    print(f"{args.commits} commits, fault probability {args.p}, {args.trials} seeded trials; --flaky at the CLI "
          f"defaults: confidence {RUN_DEFAULTS['confidence']}, max runs per commit "
          f"{RUN_DEFAULTS['max_runs_per_commit']}, fault rate {RUN_DEFAULTS['fault_rate'] or 'estimated'}")
    print(f"{'method':<18}{'accuracy':>10}{'mean runs':>12}{'claimed':>10}")
    figures = {}
    for repeat in (1, 3, 5, 10, 20):
        results = [plain(commits, c, args.p, repeat, random.Random(s)) for s, c in enumerate(culprits)]
        acc = sum(r[0] for r in results) / args.trials
        runs = sum(r[1] for r in results) / args.trials
        print(f"{f'--repeat {repeat}':<18}{acc:>10.2f}{runs:>12.1f}{'-':>10}")
        figures[f"repeat{repeat}_accuracy"], figures[f"repeat{repeat}_runs"] = acc, runs
    results = [flaky(commits, c, args.p, random.Random(s)) for s, c in enumerate(culprits)]
    acc = sum(r[0] for r in results) / args.trials
    runs = sum(r[1] for r in results) / args.trials
    claimed = sum(r[2] for r in results) / args.trials
    print(f"{'--flaky':<18}{acc:>10.2f}{runs:>12.1f}{claimed:>10.3f}")
    figures.update(flaky_accuracy=acc, flaky_runs=runs, flaky_claimed=round(claimed, 3))
    print("RESULT " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in figures.items()))


if __name__ == "__main__":
    main()
