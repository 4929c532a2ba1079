"""The engine's decisions, table-driven (as syzkaller's pkg/bisect tests are): each row a history (how many
commits, where the change is, commits that skip or fault only sometimes, --find-fix, --jobs, --repeat,
--flaky) and the answer and cost it must give. Each row runs through the real search policy, the real
driver loop (RunContext.drive), the real judge's decisions and a real SQLite store; only where a step runs
is a table (tests/fakes/executor.py). In-process and quick (one probe of the interpreter aside): the CLI tests
keep the I/O, this keeps the logic.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from fakes.executor import TableExecutor

from bisector.builds.builder import NoBuild
from bisector.engine.driver import RunContext
from bisector.engine.judge import Judge, JudgeSpec
from bisector.errors import EndpointError
from bisector.machine.envs import EnvSettings
from bisector.record.store import Store
from bisector.search.dag import Bisection, FlakyModel
from bisector.search.policies import BisectPolicy, Endpoints, FlakyPolicy, FlakySettings
from bisector.signatures import SignatureRule
from bisector.world.world import WorldSettings
from scenarios.command import CommandScenario

pytestmark = pytest.mark.integration  # one probe of the interpreter (the verdict key) is a subprocess


@dataclass(frozen=True)
class History:
    """c0 (the old end) .. c{commits-1} (the new end), linear. From c{change} on a commit is bad (with
    find_fix: good); `verdicts` overrides a commit's executions in order (the last repeats)."""

    commits: int
    change: int
    verdicts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    find_fix: bool = False
    jobs: int = 1
    repeat: int = 1
    flaky: bool = False

    def default(self, index: int) -> str:
        after = "good" if self.find_fix else "bad"
        before = "bad" if self.find_fix else "good"
        return after if index >= self.change else before


@dataclass(frozen=True)
class Expected:
    """first: the commit found (None: the answer is the range `candidates`); steps and executions as the
    run counts them (endpoints included), rounds of probes; tested: the commits asked of the executor, in
    order (None: not checked; steps of one round land as they finish)."""

    first: str | None
    steps: int
    executions: int
    rounds: int
    candidates: tuple[str, ...] = ()
    tested: tuple[str, ...] | None = None


def run(history: History, store: Store, interrupt_at: int | None = None) -> tuple[RunContext, TableExecutor, object]:
    """history through the real policy and driver on a table executor; returns the context, the executor and
    the policy. interrupt_at: Ctrl-C instead of that step (the run row is left interrupted, and the next
    call resumes it)."""
    shas = [f"c{i}" for i in range(history.commits)]
    table = {sha: history.verdicts.get(sha, (history.default(i),)) for i, sha in enumerate(shas)}
    executor = TableExecutor(table, "skip", history.jobs, interrupt_at)
    names = ("bad", "good") if history.find_fix else ("good", "bad")
    ends = Endpoints(shas[0], shas[-1], *names, shas[0], shas[-1])
    spec = JudgeSpec(CommandScenario(["true"]), NoBuild(), None, "python3", 1 if history.flaky else history.repeat,
                     SignatureRule.parse("any"))
    judge = Judge(spec, NoBuild().open(None, None), EnvSettings().open(store.path.parent),
                  WorldSettings().open(None, store.path.parent))
    commits = [(sha, (shas[i - 1],)) for i, sha in enumerate(shas) if i]
    policy: BisectPolicy | FlakyPolicy
    try:
        with store.recording("bisect", repr(history), {}) as record:
            ctx = RunContext(store, judge, executor, record.id)
            if history.flaky:
                model = FlakyModel(0.5, 0.95, 20, false_failures=True)  # as `run --flaky --fault-rate 0.5`
                policy = FlakyPolicy(commits, ends, FlakySettings(model, history.repeat, True), ctx.history)
            else:
                policy = BisectPolicy(Bisection(commits, ends.new), ends, executor.size, lambda sha: 1.0)
            ctx.drive(policy)
            record.result = {}
    except KeyboardInterrupt:
        assert interrupt_at is not None
    return ctx, executor, policy


ROWS = {
    # 16 commits after the old end: four halvings, after the two endpoint checks
    "in the middle": (History(17, 9), Expected("c9", 6, 6, 4, tested=("c0", "c16", "c8", "c12", "c10", "c9"))),
    "the first commit": (History(17, 1), Expected("c1", 6, 6, 4)),
    "the last commit": (History(17, 16), Expected("c16", 6, 6, 4)),
    "one commit in the range": (History(2, 1), Expected("c1", 2, 2, 0, tested=("c0", "c1"))),
    # --jobs 3: each round splits the candidates four ways (16 -> 4 -> 1), the first beside the endpoints (more
    # slots than endpoints); --jobs 2 three ways (16 -> 6 -> 2 -> 1), after the endpoints
    "k-way, 3 jobs": (History(17, 9, jobs=3),
                      Expected("c9", 8, 8, 1, tested=("c0", "c16", "c4", "c8", "c12", "c9", "c10", "c11"))),
    "k-way, 2 jobs": (History(17, 9, jobs=2), Expected("c9", 7, 7, 3, tested=("c0", "c16", "c5", "c11", "c7", "c9",
                                                                              "c8"))),
    # a skipped probe costs one more (its neighbour is probed instead); next to the change it stays in the answer
    "a skip beside the culprit": (History(17, 9, {"c8": ("skip",)}),
                                  Expected(None, 6, 6, 4, ("c8", "c9"), ("c0", "c16", "c8", "c7", "c11", "c9"))),
    "a skip away from it": (History(17, 9, {"c12": ("skip",)}),
                            Expected("c9", 6, 6, 4, tested=("c0", "c16", "c8", "c12", "c11", "c9"))),
    "skips around the culprit are stepped around": (
        History(17, 9, {f"c{i}": ("skip",) for i in (7, 10, 11, 12)}),
        Expected("c9", 8, 8, 6, tested=("c0", "c16", "c8", "c12", "c11", "c13", "c10", "c9"))),
    "every probe skips": (History(5, 3, {f"c{i}": ("skip",) for i in (1, 2, 3)}),
                          Expected(None, 5, 5, 3, ("c1", "c2", "c3", "c4"))),
    # --find-fix: the old end is bad, the fix is the first good commit
    "find-fix": (History(17, 5, find_fix=True), Expected("c5", 6, 6, 4)),
    "find-fix, 3 jobs": (History(17, 5, find_fix=True, jobs=3), Expected("c5", 8, 8, 1)),
    # 30 commits, the change at c17 (the H200's planted-crash history): 4 slots test 4 probes beside the two
    # endpoints, then one round of 4 (the probes after the endpoints took 2 rounds); one slot: 5 halvings
    "30 commits, 4 slots": (History(30, 17, jobs=4), Expected("c17", 10, 10, 1, tested=(
        "c0", "c29", "c6", "c12", "c17", "c23", "c13", "c14", "c15", "c16"))),
    "30 commits, 1 slot": (History(30, 17), Expected("c17", 7, 7, 5)),
    # --repeat 3: a good verdict needs three clean runs (c0, c2, c3), a fault in any run is bad at once (c8, c4
    # fault on their second): 3 + 2 + 2 + 3 + 3 executions
    "repeat catches a commit that faults on its second run":
        (History(9, 4, {f"c{i}": ("good", "bad") for i in range(4, 9)}, repeat=3),
         Expected("c4", 5, 13, 3, tested=("c0", "c8", "c4", "c2", "c3"))),
    "no repeat: the same history blames a later commit":
        (History(9, 4, {f"c{i}": ("good", "bad") for i in range(4, 8)}), Expected("c8", 5, 5, 3)),
}


@pytest.mark.parametrize("history, expected", ROWS.values(), ids=ROWS.keys())
def test_the_answer_and_its_cost(history, expected, tmp_path):
    store = Store(tmp_path / "bisector.sqlite")
    ctx, executor, policy = run(history, store)
    answer = policy.answer()
    assert answer.first_new == expected.first
    if expected.first is None:
        assert tuple(answer.candidates) == expected.candidates
    assert (len(ctx.steps), ctx.executions, policy.rounds) == (expected.steps, expected.executions, expected.rounds)
    assert sum(executor.runs.values()) == ctx.executions and len(executor.asked) == len(ctx.steps)
    if expected.tested is not None:
        assert tuple(executor.asked) == expected.tested
    first_round = sorted(step.role for step in ctx.steps if step.round == 0)
    assert first_round == ["endpoint", "endpoint"] + ["probe"] * beside_the_endpoints(history)


def beside_the_endpoints(history: History) -> int:
    """The probes the endpoint round tests: the first probe round's, when the slots outnumber the endpoints."""
    return history.jobs if history.jobs > 2 and history.commits > 2 else 0


PROBED = {name: row for name, row in ROWS.items() if row[1].steps > 2}  # rows with a step after the endpoints


@pytest.mark.parametrize("history, expected", PROBED.values(), ids=PROBED.keys())
def test_an_interrupted_run_resumes_from_its_verdicts(history, expected, tmp_path):
    """Ctrl-C after the endpoint round: the rerun is served what the first run decided, runs only the rest, and
    answers the same at the same total cost."""
    store = Store(tmp_path / "bisector.sqlite")
    served = 2 + beside_the_endpoints(history)
    first, _, _ = run(history, store, interrupt_at=served)
    assert sorted(step.role for step in first.steps) == ["endpoint", "endpoint"] + ["probe"] * (served - 2)
    again, executor, policy = run(history, store)
    assert policy.answer().first_new == expected.first
    assert [step.cached for step in again.steps] == [True] * served + [False] * (expected.steps - served)
    assert first.executions + again.executions == expected.executions
    assert sorted(executor.asked) == sorted(step.sha for step in again.steps[served:])


ALTERNATING = ("good", "bad") * 20  # a commit with the fault faults on every second run


FLAKY = {
    # --flaky: the clean end runs 10 times to learn how often a run faults where the fault is not; then one
    # run at a time where the posterior says, until 95% sure
    "every run of a bad commit faults": (History(9, 4, flaky=True), "c4", 10, 21),
    "half the runs of a bad commit fault": (History(9, 4, {f"c{i}": ALTERNATING for i in range(4, 9)}, flaky=True),
                                            "c4", 10, 26),
    # a fault at the clean end (its third run) is a false failure: it runs on to 20 to learn their rate
    "a false failure at the clean end": (History(9, 4, {**{f"c{i}": ALTERNATING for i in range(4, 9)},
                                                        "c0": ("good", "good", "bad", "good")}, flaky=True),
                                         "c4", 20, 42),
}


@pytest.mark.parametrize("history, first, clean_end_runs, executions", FLAKY.values(), ids=FLAKY.keys())
def test_the_flaky_search(history, first, clean_end_runs, executions, tmp_path):
    ctx, executor, policy = run(history, Store(tmp_path / "bisector.sqlite"))
    answer = policy.answer()
    assert answer.first_new == answer.flaky.best_guess == first and answer.flaky.confidence >= 0.95
    assert executor.runs["c0"] == clean_end_runs and executor.runs["c3"] >= 2  # the culprit's parent, tried
    assert ctx.executions == len(ctx.steps) == executions  # one run a step, every one recorded


@pytest.mark.parametrize("change, verdicts, find_fix", [
    (9, {"c16": ("good",)}, False),  # the bad end tests good
    (9, {"c0": ("bad",)}, False),  # the good end tests bad
    (5, {"c16": ("bad",)}, True),  # --find-fix: the good (new) end tests bad
])
def test_an_end_that_tests_otherwise_stops_before_any_probe(change, verdicts, find_fix, tmp_path):
    with pytest.raises(EndpointError, match="endpoint check failed"):
        run(History(17, change, verdicts, find_fix=find_fix), Store(tmp_path / "bisector.sqlite"))
