"""`run --follow-pins`: when the answer moves the AITER pin, the hunt goes on inside AITER by itself, on
built histories (tests/follow_pins_world.py): a bump inside one history, a rewritten history with
equivalents, histories with nothing in common (release tags), a bump that does not explain the change, a
kill in the second level and its resume; and the CLI with the real aiter-mla-probe."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from follow_pins_world import (
    BLOCK,
    PinnedState,
    killed_when_blocked,
    rewritten_world,
    shared_world,
    unrelated_world,
)

from bisector.engine.config import RunConfig
from bisector.engine.executor import LocalExecutor, local_slots
from bisector.engine.run import run_bisection
from bisector.errors import EXIT_ENDPOINT
from bisector.record.store import Store
from bisector.report import renderers as report
from bisector.report import tables
from bisector.seams import FollowUp
from scenarios.command import CommandScenario

pytestmark = pytest.mark.integration
WORLD = Path(__file__).resolve().parent / "follow_pins_world.py"


def follow(world, tmp_path, good=0, bad=-1, **settings):
    scenario = settings.pop("scenario", None) or PinnedState({"aiter_repo": str(world.aiter)})
    return run_bisection(RunConfig(repo=world.vllm, good=world.v[good], bad=world.v[bad], scenario=scenario,
                                   state_dir=tmp_path / "state", follow_pins=True, **settings))


def rows(tmp_path):
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        return {row["id"]: row for row in store.runs()}


def test_a_bump_inside_one_history_is_bisected_inside_aiter(tmp_path):
    world = shared_world(tmp_path)
    result = follow(world, tmp_path)
    assert result.culprit.sha == world.v[3]
    assert (result.pin_change.old, result.pin_change.new) == ("v1.0", "v2.0")
    [inside] = result.levels
    assert inside.culprit.sha == world.a["a5"] and inside.repo == str(world.aiter)
    level = inside.level
    assert (level.number, level.parent_run, level.how, level.held_commit) == (2, result.run_id, "ancestor",
                                                                             world.v[3])
    assert {step.sha for step in inside.steps if step.role == "endpoint"} == {world.a["a1"], world.a["a8"]}
    assert result.exit_code == 0

    stored = rows(tmp_path)
    assert json.loads(stored[inside.run_id]["params"])["parent_run"] == result.run_id
    assert stored[inside.run_id]["status"] == "finished"
    record = json.loads(stored[result.run_id]["result"])  # the first level's record now holds both
    assert [each["run_id"] for each in record["levels"]] == [result.run_id, inside.run_id]
    assert record["levels"][1]["culprit"]["sha"] == world.a["a5"]

    shown = report.render(stored[result.run_id], "text")
    assert shown.startswith(f"answer: vLLM {world.v[3][:12]} ({level.held_label}) moved AITER v1.0 → v2.0; "
                            f"inside AITER: first bad {world.a['a5'][:12]} (v2.0~3) AITER a5 (#5)\n")
    assert "== level 2: " + str(world.aiter) in shown and "held: v1.0 → v2.0" in shown
    for fmt, needle in (("markdown", "### Level 2"), ("html", "<h2>Level 2</h2>"),
                        ("junit", f'name="bisector run {inside.run_id}"'), ("json", '"levels"')):
        assert needle in report.render(stored[result.run_id], fmt), fmt
    junit = report.render(stored[result.run_id], "junit")
    assert junit.count("<testsuite ") == 2
    published = json.loads(report.render(stored[result.run_id], "json"))
    assert published["first_bad"]["sha"] == world.v[3] and published["levels"][1]["first_bad"]["sha"] == \
        world.a["a5"]
    listed = tables.runs_table(list(stored.values())).splitlines()[1:]
    assert f"level 2 (AITER): first bad commit {world.a['a5'][:12]}" in listed[0]
    assert f"(level 2 of --follow-pins, under run {result.run_id})" in listed[1]


class SlotsSeen(PinnedState):
    """PinnedState whose held steps (a level inside AITER) note the GPUs their slot made visible."""

    seen: list[str | None] = []

    def run(self, ctx):
        if self.options["vllm_repo"]:
            SlotsSeen.seen.append(ctx.env.get("ROCR_VISIBLE_DEVICES"))
        return super().run(ctx)

    def follow_up(self, dependency):
        return FollowUp(repo=self.options["aiter_repo"], hold=lambda repo, commit: SlotsSeen(
            {"vllm_repo": repo, "vllm_ref": commit}))


def test_a_level_inside_aiter_runs_its_steps_on_the_first_levels_gpu_slots(tmp_path):
    """--gpus 2,3 --jobs 2: the first level's steps each see one GPU; so do the level's inside AITER (they ran
    on plain slots, every step seeing every GPU, two engines side by side on the first)."""
    world = shared_world(tmp_path)
    SlotsSeen.seen = []
    slots = LocalExecutor(local_slots(2, [2, 3], 1))
    result = follow(world, tmp_path, scenario=SlotsSeen({"aiter_repo": str(world.aiter)}), executor=slots, jobs=2)
    assert result.levels[0].culprit.sha == world.a["a5"]
    assert SlotsSeen.seen and set(SlotsSeen.seen) <= {"2", "3"}, SlotsSeen.seen


def test_a_rewritten_history_is_bisected_from_the_old_pins_equivalent(tmp_path):
    world = rewritten_world(tmp_path)
    result = follow(world, tmp_path)
    [inside] = result.levels
    level = inside.level
    assert (level.how, level.equivalent, level.matched_by) == ("equivalent", world.a["n3"],
                                                               "same subject, author and author date")
    assert inside.culprit.sha == world.a["n6"]
    # the pin itself and its stand-in are both old ends, tested as the first level's old end was
    assert {step.sha: step.verdict for step in inside.steps if step.role == "endpoint"} == {
        world.a["o3"]: "good", world.a["n3"]: "good", world.a["n9"]: "bad"}
    assert not set(inside.range) & {world.a[f"o{n}"] for n in range(3)}  # nothing of the old history bisected
    text = report.bisect_text(result)
    assert f"its equivalent there, {world.a['n3'][:12]} (same subject, author and author date)" in text


@pytest.mark.parametrize("wide_from, boundary, then", [
    ("n2", ("v1.2", "v1.3"), "n2"),  # the boundary tags share history: a level bisects between them
    ("n0", ("v1.1", "v1.2"), None),  # they do not: the answer is the tag pair
])
def test_unrelated_histories_test_release_tags_then_bisect_between_the_boundary(tmp_path, wide_from, boundary,
                                                                                 then):
    world = unrelated_world(tmp_path, wide_from)
    result = follow(world, tmp_path)
    tags = result.levels[0]
    assert tags.level.how == "release tags"
    assert [tag for tag, _ in tags.level.tags] == ["v1.0", "v1.1", "v1.2", "v1.3", "v2.0"]  # no rc
    assert tags.level.tag_of(tags.culprit.sha) == boundary[1]
    answer = report.follow_answer(result)
    assert f"inside AITER: release tags {boundary[0]} → {boundary[1]}" in answer
    if then:
        [_, between] = result.levels
        assert between.level.number == 3 and between.level.parent_run == tags.run_id
        assert (between.level.old_ref, between.level.new_ref, between.level.how) == (*boundary, "ancestor")
        assert between.culprit.sha == world.a[then]
        assert answer.endswith(f", then first bad {between.named(world.a[then])} new AITER {then} (#12)")
        assert not any(step.cached is False and step.sha in (world.a["n1"], world.a["n3"])
                       for step in between.steps)  # the boundary tags' verdicts come from the cache
    else:
        assert len(result.levels) == 1
        assert result.follow_notes == ("the levels end here: v1.1 and v1.2 share no history and v1.1 has no "
                                       "equivalent in v1.2's history",)
    assert result.exit_code == 0


def test_a_bump_that_does_not_explain_the_change_stops_and_says_so(tmp_path):
    world = shared_world(tmp_path, wide_from="a0")  # every AITER is wide: the pin move changes nothing
    scenario = PinnedState({"aiter_repo": str(world.aiter)})
    vllm = world.vllm
    from follow_pins_world import commit, date, dockerfile
    clean = commit(vllm, "vLLM fixed, on AITER v1.0", {"vllm.txt": "fine\n",
                                                       "docker/Dockerfile.rocm_base": dockerfile("v1.0")}, date(10))
    bump = commit(vllm, "vLLM buggy again, AITER v2.0 (#200)", {"vllm.txt": "buggy\n",
                                                                "docker/Dockerfile.rocm_base": dockerfile("v2.0")},
                  date(11))
    commit(vllm, "vLLM docs", {"docs.md": "x\n"}, date(12))
    result = run_bisection(RunConfig(repo=vllm, good=clean, bad="HEAD", scenario=scenario,
                                     state_dir=tmp_path / "state", follow_pins=True))
    assert result.culprit.sha == bump
    [inside] = result.levels
    assert inside.culprit is None and inside.stopped.startswith(
        f"not explained by AITER alone: with {inside.level.held_label} ({bump[:12]}) held, AITER v1.0 "
        f"({world.a['a1'][:12]}) tests bad, not good as the first level's old end did")
    assert result.exit_code == inside.exit_code == EXIT_ENDPOINT
    assert rows(tmp_path)[inside.run_id]["status"] == "finished"
    assert "stopped: not explained by AITER alone" in report.bisect_text(inside)
    assert "inside AITER: not explained by AITER alone" in report.follow_answer(result)


def test_no_second_level_when_the_answer_does_not_move_the_pin_or_the_scenario_cannot_follow(tmp_path):
    world = shared_world(tmp_path)
    vllm = world.vllm
    from follow_pins_world import commit, date
    broke = commit(vllm, "vLLM breaks by itself", {"vllm.txt": "buggy\n", "extra": "1\n"}, date(20))
    result = run_bisection(RunConfig(repo=vllm, good=world.v[-1], bad=broke, scenario=CommandScenario(
        ["grep", "-q", "no-such-text", "extra"]), state_dir=tmp_path / "state", follow_pins=True,
        verify_endpoints=False))
    assert result.levels == () and result.follow_notes == (
        f"no second level: the first bad commit {broke[:12]} does not move the AITER pin (it pins AITER v2.0, "
        f"as its parent does)",)
    assert f"follow-pins: no second level: the first bad commit {broke[:12]}" in report.bisect_text(result)

    plain = run_bisection(RunConfig(repo=vllm, good=world.v[0], bad=world.v[-1], scenario=CommandScenario(
        ["sh", "-c", "grep -q v1.0 docker/Dockerfile.rocm_base"]), state_dir=tmp_path / "state", follow_pins=True))
    [note] = plain.follow_notes
    assert note.startswith("no second level: scenario command cannot judge AITER commits; continue by hand: "
                           "bisector run ")


def test_a_kill_in_the_second_level_resumes_there(tmp_path, wait_for):
    world = shared_world(tmp_path)
    block = tmp_path / "block"
    block.mkdir()
    argv = [sys.executable, str(WORLD), str(world.vllm), str(world.aiter), str(tmp_path / "state"),
            world.v[0], world.v[-1]]
    killed_when_blocked(argv, {**os.environ, BLOCK: str(block)}, block, wait_for, 240)  # at the third step inside AITER
    before = rows(tmp_path)
    [first_level] = [row for row in before.values() if json.loads(row["params"]).get("parent_run") is None]
    [second_level] = [row for row in before.values() if json.loads(row["params"]).get("parent_run")]
    assert (first_level["status"], second_level["status"]) == ("finished", "running")

    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    first, inside = result["levels"]
    assert first["executions"] == 0  # every verdict of the first level from the cache
    assert inside["resumed_from"] == second_level["id"] and inside["culprit"]["sha"] == world.a["a5"]
    cached = [step for step in inside["steps"] if step["cached"]]
    assert len(cached) == 2  # the two ends judged before the kill; the killed step ran again
    assert inside["executions"] == len(inside["steps"]) - 2
    assert rows(tmp_path)[second_level["id"]]["status"] == "interrupted"


def test_cli_follows_the_pin_with_the_real_probe(tmp_path, cli, monkeypatch):
    pytest.importorskip("torch")
    from test_aiter_mla_probe_pins import make_aiter, make_vllm

    aiter, vllm = tmp_path / "aiter", tmp_path / "vllm"
    aiter_shas, vllm_shas = make_aiter(aiter), make_vllm(vllm)
    env = {**os.environ, "BISECTOR_AITER_CACHE": str(tmp_path / "cache")}
    out = cli("run", "--repo", str(vllm), "--scenario", "aiter-mla-probe", "--find-fix", "--bad", vllm_shas["c0"],
              "--good", vllm_shas["c2"], "--option", "arch=gfx950", "--option", f"aiter_repo={aiter}",
              "--follow-pins", "--json", str(tmp_path / "answer.json"), "--state-dir", str(tmp_path / "state"),
              env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    answer = json.loads((tmp_path / "answer.json").read_text())
    first, inside = answer["levels"]
    assert first["first_good"]["sha"] == vllm_shas["c2"]
    assert inside["first_good"]["sha"] == aiter_shas["v2.0"] and inside["level"]["how"] == "ancestor"
    assert out.stdout.startswith(f"answer: vLLM {vllm_shas['c2'][:12]} (")
    assert f"inside AITER: first good {aiter_shas['v2.0'][:12]} (v2.0) AITER v2.0" in out.stdout.splitlines()[0]
    assert "level 2 inside AITER" in out.stderr
    shown = cli("report", "latest", "--repo", str(vllm), "--state-dir", str(tmp_path / "state"), env=env)
    assert shown.stdout.splitlines()[0] == out.stdout.splitlines()[0]
    listed = cli("runs", "--all-repos", "--repo", str(vllm), "--state-dir", str(tmp_path / "state"), env=env)
    assert "level 2 of --follow-pins" in listed.stdout


def test_backport_says_when_a_verdict_flips_with_a_pin_move(tmp_path):
    from follow_pins_world import commit, date, dockerfile, git

    from bisector.engine.backport import BackportConfig, run_backport

    world = shared_world(tmp_path)  # AITER v1.0 narrow, v2.0 wide; vLLM buggy, on v2.0 from c3
    git(world.vllm, "branch", "releases/v1", world.v[-1])
    fix = commit(world.vllm, "Pin AITER v1.0 again (#300)", {"docker/Dockerfile.rocm_base": dockerfile("v1.0")},
                 date(20))
    result = run_backport(BackportConfig(repo=world.vllm, fix=fix, branches=["releases/*"],
                                         scenario=PinnedState({"aiter_repo": str(world.aiter)}),
                                         state_dir=tmp_path / "state"))
    [entry] = result.branches
    assert (entry.before, entry.after, entry.verdict) == ("bad", "good", "verified")
    assert entry.reason == ("scenario bad before the pick, good after it; the pick moves AITER v2.0 → v1.0: "
                            "the flip may come from AITER")


def test_a_bare_or_remote_aiter_is_cloned_once_with_a_work_tree_into_the_cache(tmp_path, monkeypatch):
    from follow_pins_world import git

    from bisector.repo.pins import DependencyUnavailable, dependency_checkout
    from bisector.repo.refs import GitRepo

    monkeypatch.setenv("BISECTOR_AITER_CACHE", str(tmp_path / "cache"))
    world = shared_world(tmp_path)
    assert dependency_checkout(str(world.aiter), ("v1.0",)) == world.aiter  # a work tree: used as it is
    bare = tmp_path / "aiter.git"
    git(tmp_path, "clone", "-q", "--bare", str(world.aiter), str(bare))
    clone = dependency_checkout(str(bare), ("v1.0", "v2.0"))
    assert clone.parent == tmp_path / "cache" / "checkouts" and GitRepo(clone).resolve("v2.0") == world.a["a8"]
    git(bare, "tag", "v3.0", world.a["a5"])  # a ref the clone lacks is fetched
    assert dependency_checkout(str(bare), ("v3.0",)) == clone and GitRepo(clone).resolve("v3.0") == world.a["a5"]
    with pytest.raises(DependencyUnavailable, match="cannot clone https://aiter.invalid/aiter.git"):
        dependency_checkout("https://aiter.invalid/aiter.git", ("v1.0",))

    result = follow(world, tmp_path, scenario=PinnedState({"aiter_repo": str(bare)}))
    assert result.levels[0].repo == str(clone) and result.levels[0].culprit.sha == world.a["a5"]
