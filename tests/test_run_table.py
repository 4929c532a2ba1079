"""run_bisection and run_backport through their seam (syzkaller's runImpl): the real range resolution, seeds,
prefilter, store and backport decisions on one real repository per module, the steps judged in-process by each
commit's `state` file (tests/fake_executor.StateExecutor) instead of subprocesses. Each row: what is asked, and
the answer and cost it must give."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fakes.executor import StateExecutor

from bisector.engine.backport import BackportConfig, run_backport
from bisector.engine.config import RunConfig
from bisector.engine.run import run_bisection
from bisector.errors import UsageError
from scenarios.command import CommandScenario

pytestmark = pytest.mark.integration  # a real git repository (git runs), no step subprocess

STATE = CommandScenario(["grep", "-q", "good", "state"])  # what the executor stands in for


@dataclasses.dataclass(frozen=True)
class History:
    """c0 .. c15 on main, `state` bad from c11; `fixed`: c15 and the fix (state good again); release/old at c5
    (before the fault), release/new at c13 (with it)."""

    path: Path
    shas: list[str]
    fix: str


@pytest.fixture(scope="module")
def history(tmp_path_factory, repo_builder) -> History:
    repo = repo_builder(tmp_path_factory.mktemp("table") / "repo")
    shas = repo.linear(16, bad_from=11)
    repo.git("branch", "release/old", shas[5])
    repo.git("branch", "release/new", shas[13])
    repo.git("checkout", "-q", "-b", "fixed")
    fix = repo.commit("fix the fault (#2000)", {"state": "good\n"})
    repo.git("checkout", "-q", "main")
    return History(repo.path, shas, fix)


def steps_of(history: History):
    """The seam's steps: every run's (the prefilter's too) on a StateExecutor over the module's repository."""
    return lambda cfg: StateExecutor(history.path)


@dataclasses.dataclass(frozen=True)
class Expected:
    """The commit found (an index on main, or a ref), else the candidates (indexes); the executions run; or the
    UsageError the run is refused with."""

    culprit: int | str | None = None
    candidates: tuple[int, ...] = ()
    executions: int = 0
    refused: str | None = None


# name: (RunConfig fields beside repo and scenario: commits by index on main, skips as indexes or "A..B"; expected)
RUN_ROWS = {
    "the range resolved from refs": ({}, Expected(11, executions=6)),
    "a skipped culprit leaves two candidates": ({"skip": (11,)}, Expected(candidates=(11, 12), executions=5)),
    "a skipped range beside the culprit leaves three": ({"skip": ("8..10",)},
                                                       Expected(candidates=(9, 10, 11), executions=5)),
    "a skipped range away from it": ({"skip": ("4..6",)}, Expected(11, executions=6)),
    "an endpoint skipped is refused": ({"skip": (15,)}, Expected(refused="names the --bad endpoint")),
    "paths no commit touches": ({"paths": ("nothing-here",)}, Expected(refused="no commit in .* touches")),
    "--fix seeds the culprit and its parent first": ({"fix": "fixed"}, Expected(11, executions=2)),
    "--fix with --find-fix is refused": ({"fix": "fixed", "find_fix": True, "good": "fixed", "bad": 11},
                                         Expected(refused="--fix seeds a regression hunt")),
    "--prefilter seeds the expensive run with the cheap run's answer": ({"prefilter": STATE},
                                                                        Expected(11, executions=2)),
    "--find-fix: the first commit without the fault": ({"find_fix": True, "good": "fixed", "bad": 11},
                                                       Expected("fixed", executions=5)),
}


def _ref(history: History, value) -> str:
    return history.shas[value] if isinstance(value, int) else value


def _sha(history: History, value: int | str) -> str:
    return history.shas[value] if isinstance(value, int) else history.fix


@pytest.mark.parametrize("asked, expected", RUN_ROWS.values(), ids=RUN_ROWS.keys())
def test_run_bisection_rows(history, tmp_path, asked, expected):
    fields = {"good": 0, "bad": 15, **asked}
    fields["good"], fields["bad"] = _ref(history, fields["good"]), _ref(history, fields["bad"])
    fields["skip"] = tuple(_ref(history, each) if isinstance(each, int) else
                           "..".join(history.shas[int(end)] for end in each.split(".."))
                           for each in fields.get("skip", ()))
    cfg = RunConfig(repo=history.path, scenario=STATE, state_dir=tmp_path / "state", **fields)
    if expected.refused:
        with pytest.raises(UsageError, match=expected.refused):
            run_bisection(cfg, steps=steps_of(history))
        return
    result = run_bisection(cfg, steps=steps_of(history))
    culprit = None if expected.culprit is None else _sha(history, expected.culprit)
    assert (result.culprit.sha if result.culprit else None) == culprit
    assert result.candidates == ((culprit,) if culprit else tuple(history.shas[n] for n in expected.candidates))
    assert result.executions == expected.executions


@pytest.mark.parametrize("reuse_verdicts, judged_again", [(False, 6), (True, 0)])
def test_a_commands_verdicts_serve_another_run_only_with_reuse_verdicts(history, tmp_path, reuse_verdicts,
                                                                         judged_again):
    cfg = RunConfig(repo=history.path, good=history.shas[0], bad=history.shas[15], scenario=STATE,
                    state_dir=tmp_path / "state", reuse_verdicts=reuse_verdicts)
    executors: list[StateExecutor] = []

    def steps(cfg):
        executors.append(StateExecutor(history.path))
        return executors[-1]

    first, again = run_bisection(cfg, steps=steps), run_bisection(cfg, steps=steps)
    assert again.culprit and first.culprit and again.culprit.sha == first.culprit.sha == history.shas[11]
    assert (len(executors[0].asked), len(executors[1].asked)) == (6, judged_again)


# name: (branch glob, the branch's verdict)
BACKPORT_ROWS = {
    "a branch before the fault is not affected": ("release/old", "not-affected"),
    "a branch with the fault takes the fix, verified": ("release/new", "verified"),
    "the fixed branch carries it": ("fixed", "contains"),
}


@pytest.mark.parametrize("glob, verdict", BACKPORT_ROWS.values(), ids=BACKPORT_ROWS.keys())
def test_run_backport_rows(history, tmp_path, glob, verdict):
    cfg = BackportConfig(repo=history.path, fix=history.fix, branches=(glob,), scenario=STATE,
                         state_dir=tmp_path / "state")
    result = run_backport(cfg, steps=lambda cfg: StateExecutor(history.path))
    assert [entry.verdict for entry in result.branches] == [verdict]
