"""The decisions, in-process: when executions settle a verdict (Judge.decide), what a search policy tests
next and answers, what the endpoints and merge bases allow, fault signatures and the rules over them."""
from __future__ import annotations

import pytest

from bisector.builds.builder import NoBuild
from bisector.engine.judge import JudgeSpec
from bisector.errors import EndpointError
from bisector.record.results import Evidence, FlakyAnswer, MergeBase
from bisector.record.steps import Step
from bisector.record.store import Execution
from bisector.seams import Verdict
from bisector.search.dag import Bisection, FlakyModel, Term
from bisector.search.policies import BisectPolicy, CalibratePolicy, Endpoints, FlakyPolicy, FlakySettings, calibration
from bisector.signatures import SignatureRule, failure_signature, normalise
from scenarios.command import CommandScenario

pytestmark = pytest.mark.unit

HSA_FAULT = ("Memory access fault by GPU node-2 (Agent handle: 0x55d5c8a0b1c0) on address 0x7f1e2c000000. "
             "Reason: Page not present or supervisor privilege.")


def run(verdict: str, reason: str = "", seconds: float = 1.0, **details) -> Execution:
    """An execution as the judge records it: its signature and timeout typed (and in details, for humans)."""
    return Execution("c1", verdict, reason or verdict, f"/logs/{verdict}.log", seconds, "none", details,
                     signature=details.get("signature"), timed_out_after=details.get("timed_out_after"))


def judge(repeat: int = 1, signature: str = "any", timeout: float | None = None) -> JudgeSpec:
    return JudgeSpec(CommandScenario(["true"]), NoBuild(), timeout, "python3", repeat, SignatureRule.parse(signature))


# -- Judge.decide -------------------------------------------------------------------------------------

def test_no_execution_decides_nothing_and_one_bad_or_skip_decides():
    assert judge().decide([]) is None
    bad, skip = run("bad", "exit 1"), run("skip", "exit 125")
    assert judge(repeat=5).decide([run("good"), bad, skip]) == bad  # the first deciding run, in order
    assert judge(repeat=5).decide([skip, bad]) == skip


def test_repeat_needs_that_many_clean_runs_and_sums_them():
    runs = [run("good", seconds=1.5, level=n) for n in range(3)]
    assert judge(repeat=3).decide(runs[:2]) is None
    decided = judge(repeat=3).decide(runs)
    assert (decided.verdict, decided.reason, decided.seconds) == ("good", "3 clean runs", 4.5)
    assert decided.details["clean_runs"] == [{"level": 0}, {"level": 1}, {"level": 2}]
    assert decided.clean_runs == tuple(runs)
    assert judge().decide(runs[:1]) == runs[0]  # one run asked: that run, as it was


def test_a_bad_run_of_another_signature_is_a_skip():
    other = run("bad", "ImportError: cannot import name 'x'", signature="ImportError")
    decided = judge(signature="GPU memory").decide([other])
    assert decided.verdict == "skip" and decided.details["different_failure"] is True and decided.different_failure
    assert decided.reason == "different failure: ImportError (ImportError: cannot import name 'x')"
    hunted = run("bad", "fault", signature="GPU memory access fault")
    assert judge(signature="GPU memory").decide([hunted]) == hunted
    unsigned = run("bad", "exit 3 after 12 steps")  # no signature given: the reason, normalised
    assert judge(signature="GPU").decide([unsigned]).reason == "different failure: exit N after N steps " \
                                                               "(exit 3 after 12 steps)"
    assert judge(signature="^exit N after").decide([unsigned]) == unsigned


def test_auto_signature_learns_the_first_and_skips_the_rest():
    auto = judge(signature="auto")
    first = run("bad", "fault", signature="GPU memory access fault")
    assert auto.decide([first]) == first  # nothing learned yet: any bad run counts
    auto.signature.learn("GPU memory access fault")
    assert auto.decide([run("bad", "oom", signature="torch.OutOfMemoryError")]).verdict == "skip"


def test_a_timeout_skip_counts_only_until_the_timeout_grows():
    timed_out = run("skip", "timed out after 10s", timed_out_after=10.0)
    assert judge(timeout=10.0).decide([timed_out]) == timed_out
    assert judge(timeout=5.0).decide([timed_out]) == timed_out
    assert judge(timeout=20.0).decide([timed_out]) is None  # asked again with more time
    assert judge(timeout=None).decide([timed_out]) is None


# -- policies ---------------------------------------------------------------------------------------

def chain(n: int) -> tuple[list[tuple[str, tuple[str, ...]]], list[str]]:
    """c0 (the old end) .. c{n-1}: the range's commits with their parents (the old end excluded)."""
    shas = [f"c{i}" for i in range(n)]
    return [(sha, (shas[i - 1],)) for i, sha in enumerate(shas) if i], shas


def ends(shas: list[str], find_fix: bool = False, merge_bases: tuple[str, ...] = ()) -> Endpoints:
    names = ("bad", "good") if find_fix else ("good", "bad")
    return Endpoints(shas[0], shas[-1], *names, shas[0], shas[-1], merge_bases=merge_bases)


def step(sha: str, role: str, round_no: int, verdict: str, **details) -> Step:
    execution = Execution(sha, Verdict(verdict), verdict, None, 1.0, None, details,
                          signature=details.get("signature"))
    return Step(role=role, round=round_no, execution=execution, cached=False)


def drive(policy, verdict_of, history: dict | None = None) -> list[Step]:
    """What RunContext.drive does, without I/O: every batch judged by verdict_of(sha)."""
    batches, landed, steps = policy.batches(), None, []
    while True:
        try:
            batch = batches.send(landed)
        except StopIteration:
            return steps
        landed = []
        for sha, role in batch.commits:
            verdict = verdict_of(sha)
            if history is not None:
                history.setdefault(sha, []).append(run(verdict))
            landed.append(step(sha, role, batch.round, verdict))
            policy.observe(landed[-1])
        steps += landed


def test_bisect_policy_checks_the_ends_then_probes_to_the_culprit():
    commits, shas = chain(33)
    policy = BisectPolicy(Bisection(commits, shas[-1]), ends(shas), 1, lambda sha: 1.0)
    steps = drive(policy, lambda sha: "bad" if shas.index(sha) >= 21 else "good")
    assert [(s.sha, s.role, s.round) for s in steps[:2]] == [("c0", "endpoint", 0), ("c32", "endpoint", 0)]
    assert {s.role for s in steps[2:]} == {"probe"} and len(steps) - 2 == policy.rounds <= 6
    answer = policy.answer()
    assert answer.first_new == "c21" and (answer.merge_bases, answer.warnings) == ((), ())


def test_an_endpoint_that_tests_otherwise_stops_the_run():
    commits, shas = chain(5)
    policy = BisectPolicy(Bisection(commits, shas[-1]), ends(shas), 1, lambda sha: 1.0)
    with pytest.raises(EndpointError, match=r"endpoint check failed: bad c4 \(c4\) tested good, not bad"):
        drive(policy, lambda sha: "good")


def test_a_skipped_merge_base_warns_and_a_new_one_is_a_wrong_range():
    commits, shas = chain(9)
    skipped = BisectPolicy(Bisection(commits, shas[-1]), ends(shas, merge_bases=("c2",)), 1, lambda sha: 1.0)
    drive(skipped, lambda sha: "skip" if sha == "c2" else "bad" if shas.index(sha) >= 5 else "good")
    answer = skipped.answer()
    assert answer.first_new == "c5" and answer.merge_bases == (MergeBase(sha="c2", verdict="skip"),)
    assert answer.warnings[0].startswith("the merge base between c8 and [c0] had to be skipped")
    wrong = BisectPolicy(Bisection(commits, shas[-1]), ends(shas, merge_bases=("c2",)), 1, lambda sha: 1.0)
    with pytest.raises(EndpointError, match="the range is wrong: the merge base c2"):
        drive(wrong, lambda sha: "bad" if shas.index(sha) >= 2 else "good")


def test_a_seed_pair_that_brackets_the_change_settles_it_alone():
    commits, shas = chain(40)
    policy = BisectPolicy(Bisection(commits, shas[-1]), ends(shas), 1, lambda sha: 1.0, seed_pair=("c17", "c16"))
    steps = drive(policy, lambda sha: "bad" if shas.index(sha) >= 17 else "good")
    assert [(s.sha, s.role) for s in steps] == [("c17", "seed"), ("c16", "seed")]
    assert policy.confirmed and policy.answer().first_new == "c17"


def test_find_fix_maps_good_to_new():
    assert ends(["a", "b"], find_fix=True).to_term == {"bad": Term.OLD, "good": Term.NEW, "skip": Term.SKIP}
    assert ends(["a", "b"]).to_term == {"good": Term.OLD, "bad": Term.NEW, "skip": Term.SKIP}


def test_flaky_policy_answers_with_typed_confidence_and_evidence():
    commits, shas = chain(12)
    history: dict[str, list[Execution]] = {}
    policy = FlakyPolicy(commits, ends(shas), FlakySettings(FlakyModel(0.9, 0.95, 20), 1, True),
                         lambda sha: history.get(sha, []))
    drive(policy, lambda sha: "bad" if shas.index(sha) >= 7 else "good", history)
    answer = policy.answer()
    flaky = answer.flaky
    assert isinstance(flaky, FlakyAnswer) and flaky.confidence >= 0.95 and answer.first_new == flaky.best_guess == "c7"
    assert sum(seen.runs for seen in flaky.evidence.values()) == sum(len(runs) for runs in history.values())
    assert flaky.evidence["c11"] == Evidence(runs=1, faults=1)


def test_calibration_tallies_both_ends_and_advises():
    policy = CalibratePolicy("good", "bad", 4)
    verdicts = iter(["bad", "good", "good", "good", "bad", "good", "skip", "good"])
    for sha, role in (commit for batch in policy.batches() for commit in batch.commits):
        policy.observe(step(sha, role, policy.rounds, next(verdicts), signature="GPU memory access fault"))
    found = policy.reproduction()
    assert (found.bad["runs"], found.bad["bad"], found.bad["skip"]) == (4, 2, 1)
    assert found.rate == round(2 / 3, 4) and found.signature == "GPU memory access fault"
    assert "--flaky --fault-rate 0.67, or --repeat 3" in found.recommendation


@pytest.mark.parametrize("bad, good, advice", [
    ({"runs": 3, "bad": 0, "skip": 3}, {"runs": 3, "bad": 0}, "the bad end never ran to a verdict"),
    ({"runs": 3, "bad": 3, "skip": 0}, {"runs": 3, "bad": 1}, "the good end failed 1 of 3 runs"),
    ({"runs": 3, "bad": 0, "skip": 0}, {"runs": 3, "bad": 0}, "the bad end never failed in 3 runs"),
    ({"runs": 3, "bad": 3, "skip": 0}, {"runs": 3, "bad": 0}, "reproduces on every run: plain bisection"),
])
def test_calibration_advice(bad, good, advice):
    assert advice in calibration({**good, "skip": 0, "signatures": {}},
                                 {**bad, "signatures": {}}).recommendation


# -- signatures -------------------------------------------------------------------------------------

def test_signatures_are_normalised_and_name_kind_and_phase():
    other_node = HSA_FAULT.replace("node-2", "node-7").replace("0x7f1e2c000000", "0x1000")
    capture = "Capturing CUDA graphs (decode, FULL):  47/51\n"
    assert failure_signature(capture + HSA_FAULT, -6) == failure_signature(capture + other_node, -6) \
        == "GPU memory access fault during CUDA-graph capture"
    assert failure_signature(HSA_FAULT, -6) == "GPU memory access fault"
    engine = ("(EngineCore_DP0 pid=12) ImportError: cannot import name 'x'\n"
              "RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert failure_signature(engine, 1) == "ImportError"
    assert failure_signature("torch.OutOfMemoryError: HIP out of memory", 1) == "torch.OutOfMemoryError"
    assert failure_signature("nothing useful", -9) == "killed by signal 9"
    assert failure_signature("x" * 200_000, 3) == "exit 3"  # a huge line is read by its head only
    assert normalise("exit 3 at 0x7f00 after 12   steps") == normalise("exit 4 at 0x1 after 9 steps")


def test_signature_rules():
    auto = SignatureRule.parse("auto")
    assert auto.accepts("ImportError")  # nothing learned yet: the first bad run defines it
    auto.learn("GPU memory access fault")
    auto.learn("ImportError")
    assert auto.accepts("GPU memory access fault") and not auto.accepts("ImportError")
    regex = SignatureRule.parse("memory (access|aperture)")
    assert regex.accepts("GPU memory aperture violation") and not regex.accepts("ImportError")
    assert SignatureRule.parse("any").accepts("anything")
    with pytest.raises(ValueError):
        SignatureRule.parse("([unclosed")
    assert auto.record().to_json() == {"mode": "auto", "pattern": None, "signature": "GPU memory access fault"}
