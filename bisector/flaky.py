"""The --flaky loop: one run at a time on the commits FlakyBisection picks, until it is confident."""
from __future__ import annotations

from typing import Mapping

from bisector.search import Answer, FlakyBisection


def run_flaky(cfg, judge, store, run_id: int, steps: list, handler, commits: list, old: str,
              new: str, priors: Mapping[str, float] | None) -> tuple[Answer, int, dict]:
    """Endpoint checks, then probes by expected information; returns (answer, rounds, result extras).

    The old endpoint must stay clean for --repeat runs; the new one must fault within
    --max-runs-per-commit runs (with --find-fix the roles swap). Every run is stored, so a resumed
    or repeated run starts from all earlier evidence.
    """
    from bisector.engine import EndpointError, Step, UsageError

    if any(len(parents) > 1 for _, parents in commits):
        raise UsageError("--flaky needs a linear range: add --first-parent")
    shas = [sha for sha, _ in commits]
    shas = shas[:shas.index(new) + 1]
    search = FlakyBisection(shas, old, faults_mean_new=not cfg.find_fix, priors=priors,
                            fault_rate=cfg.fault_rate, confidence=cfg.confidence,
                            max_runs_per_commit=cfg.max_runs_per_commit)
    faulty, clean = (old, new) if cfg.find_fix else (new, old)
    slot_env = (cfg.slots or [{}])[0]
    seen: dict[str, int] = {}

    def take_history(sha: str) -> None:
        """Feed the stored runs of sha not yet given to the search."""
        history = judge.history(sha)
        for execution in history[seen.get(sha, 0):]:
            if execution.verdict == "skip":
                search.skip(sha)
            else:
                search.record(sha, execution.verdict == "bad")
        seen[sha] = len(history)

    def run_once(sha: str, role: str, round_no: int) -> None:
        """One more scenario run on sha, stored as an execution and a step."""
        fresh = judge.record(judge.execute(sha, [], slot_env))
        for execution in fresh:
            if execution.details.get("build_failed"):
                search.skip(sha)
            step = Step(sha, role, round_no, execution.verdict, execution.reason, False,
                        execution.seconds, execution.log_path, execution.build)
            store.add_step(run_id, len(steps), round_no, role, execution, False)
            steps.append(step)
        take_history(sha)
        handler.tested(steps[-1], len(shas), 0)

    for sha in {old, new, *shas}:
        take_history(sha)
    if cfg.verify_endpoints:
        while search.runs[search.index[clean]] < cfg.repeat:
            run_once(clean, "endpoint", 0)
        if search.faults[search.index[clean]]:
            raise EndpointError(f"endpoint check failed: {clean[:12]} faulted, so it cannot be the "
                                f"{'good' if clean == old else 'fixed'} end")
        while not search.faults[search.index[faulty]]:
            if search.runs[search.index[faulty]] >= cfg.max_runs_per_commit:
                raise EndpointError(f"endpoint check failed: {faulty[:12]} never faulted in "
                                    f"{cfg.max_runs_per_commit} runs")
            run_once(faulty, "endpoint", 0)
    round_no = 0
    while not search.done:
        round_no += 1
        run_once(search.next_probes(1)[0], "probe", round_no)
    best, confidence = search.best()
    posterior = search.posterior()
    ranked = sorted(posterior, key=lambda sha: -posterior[sha])
    found = confidence >= cfg.confidence
    answer = Answer(best if found else None, tuple(ranked[:10]))
    return answer, round_no, {"confidence": round(confidence, 6), "best_guess": best,
                              "posterior": {sha: round(posterior[sha], 6) for sha in ranked[:10]},
                              "evidence": search.evidence()}
