"""False failures: --flaky when good commits fail now and then too (issue 30 item 3).

Simulated in-process through the policy the engine drives (FlakyPolicy over FlakyBisection, endpoint checks
included): a linear range of COMMITS, every run fails falsely with probability Q, and from the culprit on a
run also faults with probability P. Each setting runs SEEDS seeded hunts with --flaky's defaults and
counts right answers (the culprit named), wrong ones (another commit named with the claimed confidence)
and inconclusive ones (no commit named, or an endpoint check failed), with the mean executions. `learned`
is today's --flaky (the false-failure rate learned from the clean end's runs); `assumed 0` is the model
before, which takes every fault for the real one.

    PYTHONPATH=. python bench/flaky_false.py [--seeds 50]
"""
import argparse
import random

from bisector.errors import EndpointError
from bisector.record.steps import Step
from bisector.record.store import Execution
from bisector.seams import Verdict
from bisector.search.dag import FlakyModel, InconsistentVerdicts
from bisector.search.policies import Endpoints, FlakyPolicy, FlakySettings

# (name, commits, culprit index or None for a uniformly drawn one, Q, P)
SETTINGS = (
    ("25% false failures everywhere, a real fault from c20", 30, 20, 0.25, 1.0),
    ("25% false failures, an intermittent real fault (P 0.5) from c20", 30, 20, 0.25, 0.5),
    ("no false failures, P 0.3, 64 commits (bench/flaky.py's setting)", 64, None, 0.0, 0.3),
    ("no false failures, P 0.5, 30 commits (tests/test_flaky.py's CLI setting)", 30, 7, 0.0, 0.5),
)


def hunt(commits: int, culprit: int, q: float, p: float, learn: bool, seed: int) -> tuple[str, int]:
    """One seeded hunt: ('right' | 'wrong' | 'inconclusive', executions)."""
    rng = random.Random(seed)
    shas = [f"c{i}" for i in range(commits)]
    ends = Endpoints(old="old", new=shas[-1], old_name="good", new_name="bad", old_ref="old", new_ref=shas[-1])
    history: dict[str, list[Execution]] = {}
    policy = FlakyPolicy([(sha, (shas[i - 1],) if i else ("old",)) for i, sha in enumerate(shas)], ends,
                         FlakySettings(FlakyModel(false_failures=learn), 1, True), lambda sha: history.get(sha, []))
    runs = 0
    try:
        batches = policy.batches()
        batch = next(batches, None)
        while batch is not None:
            landed = []
            for sha, role in batch.commits:
                at = -1 if sha == "old" else shas.index(sha)
                faulted = rng.random() < q or (at >= culprit and rng.random() < p)
                verdict = Verdict.BAD if faulted else Verdict.GOOD
                execution = Execution(sha, verdict, "", None, 0.0, None, {})
                history.setdefault(sha, []).append(execution)
                runs += 1
                step = Step(role=role, round=batch.round, execution=execution, cached=False)
                policy.observe(step)
                landed.append(step)
            try:
                batch = batches.send(landed)
            except StopIteration:
                batch = None
    except (EndpointError, InconsistentVerdicts):
        return "inconclusive", runs
    named = policy.answer().first_new
    return ("inconclusive" if named is None else "right" if named == shas[culprit] else "wrong"), runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=50)
    args = ap.parse_args()
    print(f"{args.seeds} seeded hunts per setting; --flaky at its defaults (confidence 0.95, fault rate estimated, "
          f"20 runs per commit at most)")
    print(f"{'setting':<74}{'model':<11}{'right':>7}{'wrong':>7}{'inconcl.':>9}{'mean runs':>11}")
    figures = {}
    for n, (name, commits, fixed, q, p) in enumerate(SETTINGS, 1):
        for learn in (True, False):
            outcomes = [hunt(commits, fixed if fixed is not None else random.Random(seed).randrange(commits),
                             q, p, learn, seed) for seed in range(args.seeds)]
            rate = {kind: sum(o == kind for o, _ in outcomes) / args.seeds
                    for kind in ("right", "wrong", "inconclusive")}
            runs = sum(r for _, r in outcomes) / args.seeds
            model = "learned" if learn else "assumed 0"
            print(f"{name:<74}{model:<11}{rate['right']:>7.2f}{rate['wrong']:>7.2f}{rate['inconclusive']:>9.2f}"
                  f"{runs:>11.1f}")
            tag = f"s{n}_{'learned' if learn else 'assumed0'}"
            figures.update({f"{tag}_right": rate["right"], f"{tag}_wrong": rate["wrong"], f"{tag}_runs": runs})
    print("RESULT " + " ".join(f"{k}={v:.3g}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
