"""Hostile rows for performance hunts and marks (issue 45 items 7 and 8).

Item 7: a mark on a performance hunt, resumed, looped on the marked commit forever (0 executions, a record of
89 MB): every policy with a mark on a commit, resumed, must end, and the driver stops a policy that asks again
for what it was just answered with nothing new. Item 8: a metric whose values are negative (a log-probability)
inverted the direction of the change; a baseline of 0 divided by zero.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bisector.builds.builder import NoBuild
from bisector.engine.driver import RunContext
from bisector.engine.judge import Judge, JudgeSpec
from bisector.errors import AbortError, EndpointError
from bisector.machine.envs import EnvSettings
from bisector.record.steps import Handler
from bisector.record.store import Execution, Store
from bisector.seams import Verdict
from bisector.search.dag import Bisection, FlakyModel
from bisector.search.policies import Batch, BisectPolicy, CalibratePolicy, Endpoints, FlakyPolicy, FlakySettings
from bisector.signatures import SignatureRule
from bisector.world.world import WorldSettings
from scenarios.command import CommandScenario

pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")

pytestmark = pytest.mark.integration

STEPS_CAP = 400  # far more steps than any of these hunts takes: a run past it loops

# The metric by commit: the good commits at GOOD, the bad ones at BAD, each commit's runs 0, 1, 2 over it in turn
# (a spread, so the rank tests have one). A probe (not an end) waits, before `release` exists, until released.
SCRIPT = """
echo ran >> "$PIDS/ran-$n"
runs=$(wc -l < "$PIDS/ran-$n")
if [ "$n" != 0 ] && [ "$n" != 7 ] && [ -e "$PIDS/hold" ] && [ ! -e "$PIDS/release" ]; then
  echo "$n" > "$PIDS/blocked.tmp" && mv "$PIDS/blocked.tmp" "$PIDS/blocked"
  while [ ! -e "$PIDS/release" ]; do sleep 0.05; done
fi
if grep -q good state; then base={good}; else base={bad}; fi
echo "BISECTOR_METRIC score=$((base + runs % 3))"
"""


def steps_of(state: Path, run_id: int) -> int:
    """How many steps the record holds for run_id (0 while the record cannot be read: a writer holds it)."""
    try:
        with sqlite3.connect(f"file:{state / 'bisector.sqlite'}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,)).fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def run_bounded(argv: list[str], env: dict, state: Path, run_id: int, wait_for) -> subprocess.CompletedProcess:
    """argv run to its end, or killed once its run holds more than STEPS_CAP steps (a loop): the test fails."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert wait_for(lambda: proc.poll() is not None or steps_of(state, run_id) > STEPS_CAP, 600)
        looped = proc.poll() is None
        if looped:
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not looped, f"run {run_id} looped: over {STEPS_CAP} steps recorded, still running"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture
def interrupted_hunt(make_repo, tmp_path, script_scenario, git_env, project_root, wait_for):
    """A performance hunt of 8 commits (the metric falls from 1000 to 900 at commit 5, higher is better) stopped
    by SIGTERM while its first probe runs. Returns (repo, shas, argv, env, state dir, index of that probe)."""
    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    scenario = script_scenario(SCRIPT.format(good=1000, bad=900))
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", shas[0], "--bad",
            shas[-1], "--state-dir", str(state), "--metric", "score", "--higher-is-better", "--json",
            str(tmp_path / "r.json"), "--", *scenario.argv]
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root)}
    (tmp_path / "hold").touch()
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    blocked = tmp_path / "blocked"
    assert wait_for(lambda: blocked.exists() or first.poll() is not None) and first.poll() is None, \
        first.communicate()[1]
    probe = int(blocked.read_text())
    first.send_signal(signal.SIGTERM)
    _, said = first.communicate(timeout=120)
    assert first.returncode == 130, said
    (tmp_path / "release").touch()
    (tmp_path / f"ran-{probe}").unlink()
    return repo, shas, argv, env, state, probe


@pytest.mark.parametrize("truth", ["opposite", "skip"])
def test_a_mark_on_a_performance_hunt_is_used_once_and_the_resumed_hunt_ends(interrupted_hunt, tmp_path, cli,
                                                                          wait_for, truth):
    """Item 7: the probe marked (the opposite of what it measures, or skip), the resumed hunt ends with an answer
    that used the mark, the marked commit never measured and one step of it in the record."""
    repo, shas, argv, env, state, probe = interrupted_hunt
    verdict = ("bad" if probe < 5 else "good") if truth == "opposite" else "skip"
    marked = cli("mark", "latest", shas[probe], verdict, "--reason", "seen by eye", "--repo", str(repo.path),
                 "--state-dir", str(state))
    assert marked.returncode == 0, marked.stderr

    resumed = run_bounded(argv, env, state, 2, wait_for)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["resumed_from"] == 1
    assert not (tmp_path / f"ran-{probe}").exists()  # the marked commit was not measured
    assert [step["manual"] for step in result["steps"] if step["sha"] == shas[probe]] == [True]
    [entry] = [entry for entry in result["perf"]["commits"] if entry["sha"] == shas[probe]]
    assert entry["verdict"] == verdict and entry["reason"] == "marked by hand: seen by eye" and not entry["samples"]
    if verdict == "skip":  # a skip as git bisect skip: beside the change it leaves a range, else the answer stands
        assert resumed.returncode in (0, 1), resumed.stderr
        assert shas[5] in ([result["first_bad"]["sha"]] if resumed.returncode == 0 else result["candidates"])
    else:
        assert resumed.returncode == 0, resumed.stderr
        assert result["first_bad"]["sha"] == shas[probe if verdict == "bad" else probe + 1]


def test_a_mark_on_a_performance_hunts_end_is_refused_in_one_line(interrupted_hunt, cli, hostile):
    """Item 7: a performance hunt's ends are measured: a verdict by hand there is no sample; refused, nothing
    stored."""
    repo, shas, _, _, state, _ = interrupted_hunt
    for end, verdict in ((shas[0], "good"), (shas[-1], "bad")):
        refused = cli("mark", "latest", end, verdict, "--repo", str(repo.path), "--state-dir", str(state))
        line = hostile.one_line_error(refused)
        assert "performance hunt" in line and "measured" in line, line
    with sqlite3.connect(state / "bisector.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM marks").fetchone()[0] == 0


# -- every policy kind with a mark on a commit, resumed, ends ---------------------------------------------------

class Measured:
    """An Executor judging c{i} good with a metric: 1000 before c5, 900 from c5 on (c0..c8), each commit's runs
    0, 1, 2 over it in turn; faults (bad) from c5 on for the exit-code policies."""

    size = 1

    def __init__(self, metric: bool):
        self.metric, self.runs, self.asked = metric, {}, []

    def start(self, pool, logs) -> None:
        pass

    def run_step(self, judge, sha: str, done: list):
        from concurrent.futures import Future

        self.asked.append(sha)
        n = self.runs[sha] = self.runs.get(sha, 0) + 1
        bad = int(sha[1:]) >= 5
        if self.metric:
            execution = Execution(sha, Verdict.GOOD, "exit 0", None, 0.1, None, {},
                                  metrics={"score": (900.0 if bad else 1000.0) + n % 3})
        else:
            execution = Execution(sha, Verdict.BAD if bad else Verdict.GOOD, "table", None, 0.1, None, {})
        future: Future = Future()
        future.set_result([execution])
        return future

    def cancel(self, future) -> None:
        pass

    def shutdown(self) -> None:
        pass


class Capped(Handler):
    """Stops a run that lands more than STEPS_CAP steps (a loop) instead of letting it grow the record."""

    def __init__(self) -> None:
        self.landed = 0

    def tested(self, step, left: int, steps_left: int) -> None:
        self.landed += 1
        assert self.landed <= STEPS_CAP, f"over {STEPS_CAP} steps: the policy loops"


SHAS = [f"c{i}" for i in range(9)]
COMMITS = [(sha, (SHAS[i - 1],)) for i, sha in enumerate(SHAS) if i]
ENDS = Endpoints(SHAS[0], SHAS[-1], "good", "bad", SHAS[0], SHAS[-1])


def _policy(kind: str, ctx: RunContext):
    from bisector.search.perf import Direction, PerfSettings
    from bisector.search.policies import PerfPolicy

    if kind == "bisect":
        return BisectPolicy(Bisection(COMMITS, ENDS.new), ENDS, 1, lambda sha: 1.0)
    if kind == "flaky":
        model = FlakyModel(0.5, 0.95, 20, false_failures=True)
        return FlakyPolicy(COMMITS, ENDS, FlakySettings(model, 1, True), ctx.history)
    if kind == "perf":
        return PerfPolicy(Bisection(COMMITS, ENDS.new), ENDS, PerfSettings("score", Direction.HIGHER),
                          ctx.history, marks=ctx.marks)
    return CalibratePolicy(SHAS[0], SHAS[-1], 3)


MARKED = {  # policy kind, marked commit, verdict -> what the answer must be (None: the policy has none)
    "bisect, a probe": ("bisect", "c4", "bad", "c4"),
    "bisect, an end": ("bisect", "c0", "good", "c5"),
    "flaky, a probe": ("flaky", "c4", "bad", None),
    "flaky, its clean end": ("flaky", "c0", "good", None),
    "perf, a probe": ("perf", "c4", "bad", "c4"),
    "perf, a probe skipped": ("perf", "c6", "skip", None),
    "perf, an end": ("perf", "c0", "good", "c5"),
    "calibrate, an end": ("calibrate", "c0", "bad", None),
}


@pytest.mark.parametrize("kind, sha, verdict, first", MARKED.values(), ids=MARKED.keys())
def test_every_policy_with_a_mark_on_a_commit_resumed_ends(kind, sha, verdict, first, tmp_path):
    """Item 7, every policy kind: a run stopped, a mark on one of its commits (as `bisector mark` stores it, also
    where that command refuses one: a record from before), the run resumed through the real driver and store:
    it ends, the mark used at most once, within a bounded number of steps."""
    store = Store(tmp_path / "bisector.sqlite")
    spec = JudgeSpec(CommandScenario(["true"]), NoBuild(), None, "python3", 1, SignatureRule.parse("any"))
    judge = Judge(spec, NoBuild().open(None, None), EnvSettings().open(tmp_path), WorldSettings().open(None, tmp_path))
    executor = Measured(metric=kind == "perf")
    with pytest.raises(KeyboardInterrupt), store.recording("bisect", kind, {}):
        raise KeyboardInterrupt  # the run stopped before it tested anything: resumable
    store.add_mark(1, sha, Verdict(verdict), "seen by eye")
    with store.recording("bisect", kind, {}) as record:
        assert record.resumed_from == 1
        ctx = RunContext(store, judge, executor, record.id, Capped())
        policy = _policy(kind, ctx)
        try:
            ctx.drive(policy)
        except EndpointError:
            assert kind == "flaky"  # a fault that never comes at its max runs: an honest stop, no loop
        record.result = {}
    assert sum(step.execution.manual for step in ctx.steps) <= 1  # the mark is used once at most
    answer = policy.answer()
    if first is not None:
        assert answer.first_new == first
    if kind == "perf" and verdict == "skip":
        assert sha in answer.candidates or answer.first_new == "c5"
    if kind in ("bisect", "perf") and sha not in (ENDS.old, ENDS.new):
        assert sha not in executor.asked  # a marked probe is used, not tested


class Stuck:
    """A policy with a bug: it asks for the same commit however it is answered."""

    rerun, rounds, confirmed, learns_signature, verify_endpoints = False, 0, False, False, False

    def batches(self):
        while True:
            yield Batch(1, (("c4", "probe"),))

    def observe(self, step) -> None:
        pass

    def wants(self, sha: str) -> bool:
        return True

    def progress(self) -> tuple[int, int]:
        return 1, 1


@pytest.mark.parametrize("served", ["cached", "marked"])
def test_a_policy_that_asks_again_what_was_answered_with_nothing_new_is_stopped(served, tmp_path):
    """Item 7, the driver's guard: a policy that asks again for the batch it was just answered with a verdict
    served (cached or given by hand), nothing run, stops with one clear error, not a loop and an ever-growing
    record."""
    store = Store(tmp_path / "bisector.sqlite")
    spec = JudgeSpec(CommandScenario(["true"]), NoBuild(), None, "python3", 1, SignatureRule.parse("any"))
    judge = Judge(spec, NoBuild().open(None, None), EnvSettings().open(tmp_path), WorldSettings().open(None, tmp_path))
    executor = Measured(metric=False)
    with store.recording("bisect", "stuck", {}) as record:
        if served == "marked":
            store.add_mark(record.id, "c4", Verdict.BAD, "")
        ctx = RunContext(store, judge, executor, record.id, Capped())
        with pytest.raises(AbortError, match="asked again for the same commits") as stopped:
            ctx.drive(Stuck())
        record.result = {}
    assert "c4" in str(stopped.value) and "\n" not in str(stopped.value)
    assert len(ctx.steps) == 2  # asked twice: the first answer new (run, or a mark used the first time), the second not


# -- item 8: a metric whose values are negative, or whose baseline is 0 -----------------------------------------

def _samples(centre: float) -> list[float]:
    """Seven samples whose median is centre."""
    return [centre + spread for spread in (0.0, 0.01, -0.01, 0.02, -0.02, 0.03, -0.03)]


DIRECTION_ROWS = {  # (good end's median, bad end's median, direction) -> whether the bad end is the worse one
    "positive, higher, fell": (100.0, 90.0, "higher-is-better", True),
    "positive, lower, fell": (100.0, 90.0, "lower-is-better", False),
    "positive, lower, rose": (100.0, 110.0, "lower-is-better", True),
    "negative, higher, fell": (-10.0, -20.0, "higher-is-better", True),
    "negative, lower, fell": (-10.0, -20.0, "lower-is-better", False),
    "negative, lower, rose": (-20.0, -10.0, "lower-is-better", True),
    "negative, higher, rose": (-20.0, -10.0, "higher-is-better", False),
    "mixed, lower, rose": (-1.0, 1.0, "lower-is-better", True),
    "mixed, higher, fell": (1.0, -1.0, "higher-is-better", True),
    "mixed, higher, rose": (-1.0, 1.0, "higher-is-better", False),
    "zero, lower, rose": (0.0, 5.0, "lower-is-better", True),
    "zero, higher, fell": (0.0, -5.0, "higher-is-better", True),
    "zero, lower, fell": (0.0, -5.0, "lower-is-better", False),
    "zero, higher, rose": (0.0, 5.0, "higher-is-better", False),
}


@pytest.mark.unit
@pytest.mark.parametrize("good, bad, direction, worse", DIRECTION_ROWS.values(), ids=DIRECTION_ROWS.keys())
def test_the_direction_of_a_change_holds_for_negative_and_zero_baselines(good, bad, direction, worse):
    """Item 8: the ends' check of a performance hunt (the real PerfPolicy) on each sign of baseline: a change for
    the worse is hunted, the other way is refused as "the wrong way"; a baseline of 0 divides nothing."""
    from bisector.search.perf import Direction, PerfSettings
    from bisector.search.policies import PerfPolicy

    history = {sha: [Execution(sha, Verdict.GOOD, "exit 0", None, 0.1, None, {}, metrics={"score": value})
                     for value in values] for sha, values in ((SHAS[0], _samples(good)), (SHAS[-1], _samples(bad)))}
    policy = PerfPolicy(Bisection(COMMITS, ENDS.new), ENDS, PerfSettings("score", Direction(direction)),
                        lambda sha: history.get(sha, []))
    if worse:
        assert next(policy.batches()).commits[0][1] == "probe"  # the ends differ: the first probe is asked
    else:
        with pytest.raises(EndpointError, match=f"differ the wrong way for {direction}") as refused:
            next(policy.batches())
        assert ("absolute" in str(refused.value)) == (good == 0), refused.value


CHANGE_ROWS = {  # (before, after) -> the relative change (None: from 0, absolute) and the change itself
    "positive": (100.0, 90.0, -0.1),
    "negative, fell": (-10.0, -20.0, -1.0),
    "negative, rose": (-20.0, -10.0, 0.5),
    "mixed, rose": (-1.0, 1.0, 2.0),
    "mixed, fell": (1.0, -1.0, -2.0),
    "zero, rose": (0.0, 5.0, None),
    "zero, fell": (0.0, -5.0, None),
}


@pytest.mark.unit
@pytest.mark.parametrize("before, after, relative", CHANGE_ROWS.values(), ids=CHANGE_ROWS.keys())
def test_relative_change_is_of_the_baselines_magnitude_and_absolute_from_zero(before, after, relative):
    """Item 8, bisector.search.perf.change: (after - before) / |before|, its interval on the same side of 0 as the
    change; from a baseline of 0 the absolute change, and its interval, in the metric's units; the words say
    which (bisector.report.perf.change_text)."""
    from bisector.report.perf import MINUS, change_text
    from bisector.search.perf import Change, change

    moved = change(_samples(before), _samples(after))
    assert moved.absolute == pytest.approx(after - before)
    if relative is None:
        assert moved.relative is None
        assert moved.low <= moved.absolute <= moved.high and math.copysign(1, moved.low) == math.copysign(1, after)
    else:
        assert moved.relative == pytest.approx(relative)
        assert moved.low <= moved.relative <= moved.high
        assert math.copysign(1, moved.low) == math.copysign(1, moved.high) == math.copysign(1, relative)
    said = change_text("logprob", Change.from_json(json.loads(json.dumps(moved.rounded().to_json()))))  # as stored
    sign = "+" if after > before else MINUS
    if relative is None:
        assert f"({sign}5.00 absolute, from 0;" in said, said
    else:
        assert f"({sign}{abs(relative) * 100:.1f} %," in said, said


def test_a_real_hunt_on_a_negative_metric_names_the_planted_commit(make_repo, tmp_path, script_scenario, cli):
    """Item 8 on the real CLI: a log-probability falls from about -1000 to -2000 at commit 5; with
    --higher-is-better that is the regression, and the hunt names commit 5; with --lower-is-better the same data
    is refused as the wrong way (exit 3)."""
    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    scenario = script_scenario(SCRIPT.format(good=-1000, bad=-2000))
    for direction, code in (("--higher-is-better", 0), ("--lower-is-better", 3)):
        out = tmp_path / f"{direction}.json"
        hunt = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
                   str(tmp_path / "state"), "--metric", "score", direction, "--json", str(out), "--",
                   *scenario.argv)
        assert hunt.returncode == code, hunt.stderr
        result = json.loads(out.read_text())
        if code == 0:
            assert result["first_bad"]["sha"] == shas[5]
            assert -1.01 < result["perf"]["change"]["relative"] < -0.99  # −100 %: twice as far below 0
            [said] = [line for line in hunt.stdout.splitlines() if line.startswith("performance: ")]
            assert f"({MINUS_SIGN}100." in said and "higher is better" in said, said  # fell, said as falling
        else:
            assert "the endpoints differ the wrong way for lower-is-better" in hunt.stderr


MINUS_SIGN = "\u2212"
