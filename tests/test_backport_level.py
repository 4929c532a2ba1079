"""`backport --follow-pins` through the real CLI: a level inside AITER is heard from as `run --follow-pins` is (a
heading, then its steps); a kill while it judges an AITER commit, then the same command, resumes that level (no
AITER commit judged twice) with the same answer; and a question `run --follow-pins` already answered is reused,
naming the run that answered it. The pinned-state scenario (tests/follow_pins_world.py), made to wait at a
marker, is declared to the CLI by an entry point, as a plug-in is."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from follow_pins_world import PinnedState
from test_backport_follow_pins import backport, flip_world

from bisector.engine.config import RunConfig
from bisector.engine.run import run_bisection
from bisector.record.store import Store
from bisector.report import renderers as report
from bisector.seams import FollowUp

pytestmark = pytest.mark.integration
TESTS = Path(__file__).resolve().parent
BLOCK = "BACKPORT_LEVEL_BLOCK"  # a folder: the third AITER commit judged says so there, and waits for `release`


class BlockingPinnedState(PinnedState):
    """pinned-state whose held steps count themselves in $BACKPORT_LEVEL_BLOCK; the third waits until released."""

    name = "blocking-pinned-state"
    block_variable = BLOCK

    def follow_up(self, dependency: str) -> FollowUp | None:
        return FollowUp(repo=self.options["aiter_repo"], hold=lambda repo, commit: BlockingPinnedState(
            {"vllm_repo": repo, "vllm_ref": commit}))


@pytest.fixture
def plugin_env(tmp_path) -> dict:
    """PYTHONPATH holding the checkout, the tests and an entry point naming this module's scenario."""
    info = tmp_path / "site" / "pinned_state-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pinned-state\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[bisector.scenarios]\nblocking-pinned-state = "
                                           "test_backport_level:BlockingPinnedState\n")
    return {"PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS), str(tmp_path / "site")])}


def argv(world: dict, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "bisector.cli", "backport", "--repo", str(world["vllm"]), "--fix", world["fix"],
            "--branches", "releases/*", "--scenario", "blocking-pinned-state", "--option",
            f"aiter_repo={world['aiter']}", "--follow-pins", "--state-dir", str(tmp_path / "state"),
            "--json", str(tmp_path / "out.json")]


def aiter_executions(tmp_path: Path, world: dict) -> list[str]:
    """The AITER commits judged (the levels' executions), one entry per execution."""
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        return [row["sha"] for row in store.db.execute("SELECT sha FROM executions")
                if row["sha"] in world["a"].values()]


def test_cli_shows_the_level_and_its_steps_and_resumes_it_after_a_kill(tmp_path, plugin_env, wait_for):
    world = flip_world(tmp_path)
    block = tmp_path / "block"
    block.mkdir()
    env = {**os.environ, **plugin_env}
    killed = subprocess.Popen(argv(world, tmp_path), env={**env, BLOCK: str(block)}, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the level's two ends are judged, then its third AITER commit says so and waits
    assert wait_for(lambda: (block / "blocked").exists() or killed.poll() is not None), "never blocked"
    assert killed.poll() is None, killed.communicate()
    os.killpg(killed.pid, signal.SIGTERM)
    (block / "release").touch()  # the step in flight may end now: the interrupted command waits for it
    _, said = killed.communicate(timeout=120)
    assert killed.returncode == 130, said
    v2 = subprocess.run(["git", "-C", str(world["vllm"]), "rev-parse", "releases/v2"], capture_output=True,
                        text=True, check=True).stdout.strip()
    lines = said.splitlines()
    heading = lines.index(f"follow-pins: releases/v2 tests good, releases/v1 bad; AITER v1.0 → v2.0: bisecting "
                          f"inside AITER ({v2[:12]} held)")
    assert lines[heading + 1].startswith(f"level 2 inside AITER ({world['aiter']}), ") and \
        lines[heading + 1].endswith(f"({v2[:12]}) held: v1.0 → v2.0"), lines[heading + 1]
    assert lines[heading + 2].startswith("run ") and lines[heading + 2].endswith(": 5 commits in range"), said
    steps = [line for line in lines[heading:] if line.startswith("step ")]
    assert len(steps) == 2 and all(" | " in line for line in steps), said  # the two ends, in run's form
    assert lines[-1].startswith("bisector: interrupted;"), said
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        [level] = [row for row in store.runs() if json.loads(row["params"]).get("level") == 2]
        assert level["status"] == "interrupted"
    judged_before = aiter_executions(tmp_path, world)
    assert len(judged_before) in (2, 3)  # the ends, and the step in flight when it ended in time

    again = subprocess.run(argv(world, tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f", resuming run {level['id']}" in again.stderr
    judged = aiter_executions(tmp_path, world)
    assert sorted(set(judged)) == sorted(judged) and set(judged_before) < set(judged)  # none judged twice
    v1_entry, v2_entry = json.loads((tmp_path / "out.json").read_text())["branches"]
    assert v2_entry["pin_level"]["culprit"] == world["a"]["a4"] and not v2_entry["pin_level"]["reused"]
    answer = v2_entry["pin_level"]["answer"]
    assert answer == f"first good {world['a']['a4'][:12]} (v2.0~2) AITER a4 (#4)"  # as an uninterrupted one says
    assert f"releases/v2: releases/v1 → this branch moves AITER v1.0 → v2.0; inside AITER: {answer}" in \
        again.stderr.splitlines()


def test_a_question_run_follow_pins_answered_is_reused_naming_that_run(tmp_path):
    world = flip_world(tmp_path)
    git_rev = subprocess.run(["git", "-C", str(world["vllm"]), "rev-parse", "releases/v2"], capture_output=True,
                             text=True, check=True).stdout.strip()
    first = run_bisection(RunConfig(repo=world["vllm"], good="releases/v2", bad="releases/v1", find_fix=True,
                                    scenario=PinnedState({"aiter_repo": str(world["aiter"])}),
                                    state_dir=tmp_path / "state", follow_pins=True))
    assert first.culprit and first.culprit.sha == git_rev  # the bump: the same commit backport holds
    [inside] = first.levels
    assert inside.culprit and inside.culprit.sha == world["a"]["a4"]
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        runs_before = len(store.runs())
    judged = aiter_executions(tmp_path, world)

    result = backport(world, tmp_path)
    level = result.branches[1].pin_level
    assert (level.reused, level.reused_from, level.runs, level.culprit) == (True, first.run_id, (inside.run_id,),
                                                                          world["a"]["a4"])
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        kinds = [row["kind"] for row in store.runs()[runs_before:]]
    assert kinds == ["backport"]  # no level run of its own
    assert aiter_executions(tmp_path, world) == judged  # no AITER commit judged
    said = f"inside AITER (reused from run {first.run_id}): first good {world['a']['a4'][:12]}"
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        row = store.run(result.run_id)
    for fmt in ("text", "markdown", "html", "junit"):
        assert said in report.render(row, fmt), fmt
    assert json.loads(json.dumps(result.to_json()))["branches"][1]["pin_level"]["reused_from"] == first.run_id

    twice = backport(world, tmp_path, repeat=2)  # another question: each verdict of two runs
    assert not twice.branches[1].pin_level.reused and twice.branches[1].pin_level.culprit == world["a"]["a4"]
    fresh = backport(world, tmp_path, no_cache=True)  # --no-cache asks again
    assert not fresh.branches[1].pin_level.reused and fresh.branches[1].pin_level.runs != (inside.run_id,)
