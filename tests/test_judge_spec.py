"""Settings apart from opened objects: a JudgeSpec (settings, pickled into Ray tasks) opens the Judge that
tests where the step runs; the single-commit jobs and the level planner answer with types."""
from __future__ import annotations

import json
import pickle
import sys

import pytest

from bisector.builds.base import Build
from bisector.builds.builder import NoBuild
from bisector.engine.follow import NoLevel, plan_level
from bisector.engine.judge import Judge, JudgeSpec
from bisector.engine.run import calibrate, judge_one
from bisector.machine.envs import Environments, EnvSettings
from bisector.record.results import Calibration, JudgedCommit
from bisector.repo.refs import GitRepo
from bisector.seams import Verdict
from bisector.world.world import World
from scenarios.command import CommandScenario

pytestmark = pytest.mark.integration


def test_a_spec_pickles_as_settings_and_opens_a_judge_of_opened_objects(make_repo, tmp_path):
    repo = make_repo()
    repo.linear(1, bad_from=None)
    spec = JudgeSpec(CommandScenario(["true"]), NoBuild(), 5.0, sys.executable, envs=EnvSettings("per-commit"))
    shipped = pickle.loads(pickle.dumps(spec))
    assert shipped.key == spec.key and shipped.envs == spec.envs
    judge = shipped.open(GitRepo(repo.path), tmp_path / "state")
    assert isinstance(judge, Judge) and judge.spec is shipped and judge.key == spec.key
    assert isinstance(judge.builder, Build) and isinstance(judge.envs, Environments)
    assert isinstance(judge.world, World)


def test_judge_one_and_calibrate_answer_with_types_whose_json_the_cli_writes(make_repo, tmp_path, cli,
                                                                               state_is_good):
    repo = make_repo()
    shas = repo.linear(2, bad_from=1)
    state = tmp_path / "state"
    spec = JudgeSpec(CommandScenario(state_is_good), NoBuild(), None, sys.executable)
    judged = judge_one(repo.path, shas[1], spec, state)
    assert isinstance(judged, JudgedCommit) and (judged.sha, judged.verdict, judged.cached) == \
        (shas[1], Verdict.BAD, False)
    out = tmp_path / "run.json"
    proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", shas[1], "--state-dir", str(state),
               "--json", str(out), "--", *state_is_good)
    assert proc.returncode == 1, proc.stderr
    written = json.loads(out.read_text())
    assert list(written) == list(judged.to_json()) and written["verdict"] == "bad" and written["sha"] == shas[1]
    calibrated = calibrate(repo.path, (shas[0], shas[1]), spec, 1, state)
    assert isinstance(calibrated, Calibration) and calibrated.reproduction_rate == 1.0
    assert [step.role for step in calibrated.steps] == ["bad end", "good end"]
    assert list(calibrated.to_json()) == ["scenario", "runs", "good", "bad", "reproduction_rate", "signature",
                                          "recommendation", "options", "steps"]


def test_a_level_that_cannot_be_planned_raises_why(make_repo):
    repo = make_repo()
    shas = repo.linear(2, bad_from=None)
    with pytest.raises(NoLevel, match="are one commit"):
        plan_level(GitRepo(repo.path), shas[0], shas[0], tags=True)
    with pytest.raises(NoLevel, match="is an ancestor of .*: the pin moved back"):
        plan_level(GitRepo(repo.path), shas[1], shas[0], tags=True)
    assert plan_level(GitRepo(repo.path), shas[0], shas[1], tags=True).how == "ancestor"
