"""`backport --follow-pins`: a branch whose tip tests unlike the branch before it, and pins AITER elsewhere, gets
the AITER commit that changes it (a level inside AITER between the two pins, the tip held), in every format; a
second backport asking the same question reuses that answer (no new execution, no new level run). Built
histories: the pinned-state world (tests/follow_pins_world.py) and, through the CLI, the real aiter-mla-probe at
gfx950 (the v0.21 shape: AITER v2.0 sizes both query dtypes alike there, so the newer branch tests good)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from follow_pins_world import PinnedState, commit, date, dockerfile, git, init

from bisector.engine.backport import BackportConfig, run_backport
from bisector.record.store import Store
from bisector.report import backport as backport_report
from bisector.report import renderers as report
from bisector.report import tables

pytestmark = pytest.mark.integration


def flip_world(root: Path) -> dict:
    """AITER a0..a6 (v1.0 at a1 says wide, a4 narrows it, v2.0 at a6); vLLM buggy throughout: main c0 pins
    v1.0 (releases/v1 there), c1 docs, then the fix (vllm.txt fine); releases/v2 bumps c1 to v2.0."""
    aiter = init(root / "aiter")
    a = {}
    for n in range(7):
        a[f"a{n}"] = commit(aiter, f"AITER a{n} (#{n})", {"aiter.txt": "narrow\n" if n >= 4 else "wide\n"}, date(n))
    git(aiter, "tag", "v1.0", a["a1"])
    git(aiter, "tag", "v2.0", a["a6"])
    vllm = init(root / "vllm")
    c0 = commit(vllm, "vLLM c0 (#100)", {"docker/Dockerfile.rocm_base": dockerfile("v1.0"), "vllm.txt": "buggy\n"},
                date(0))
    git(vllm, "branch", "releases/v1", c0)
    c1 = commit(vllm, "vLLM docs (#101)", {"docs.md": "x\n"}, date(1))
    git(vllm, "checkout", "-q", "-b", "releases/v2")
    commit(vllm, "Bump AITER to v2.0 (#102)", {"docker/Dockerfile.rocm_base": dockerfile("v2.0")}, date(2))
    git(vllm, "checkout", "-q", "main")
    fix = commit(vllm, "Fix the builder (#103)", {"vllm.txt": "fine\n"}, date(3))
    return {"aiter": aiter, "vllm": vllm, "a": a, "fix": fix, "c1": c1}


def backport(world: dict, tmp_path: Path, **settings):
    return run_backport(BackportConfig(repo=world["vllm"], fix=world["fix"], branches=["releases/*"],
                                       scenario=PinnedState({"aiter_repo": str(world["aiter"])}),
                                       state_dir=tmp_path / "state", follow_pins=True, **settings))


def stored(tmp_path: Path) -> tuple[list, int]:
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        return store.runs(), store.db.execute("SELECT COUNT(*) FROM executions").fetchone()[0]


def test_a_branch_that_flips_with_its_aiter_pin_names_the_aiter_commit_and_a_second_run_reuses_it(tmp_path):
    world = flip_world(tmp_path)
    result = backport(world, tmp_path)
    v1, v2 = result.branches
    assert (v1.branch, v1.pin, v1.before, v1.verdict, v1.pin_level) == ("releases/v1", "v1.0", "bad", "verified",
                                                                         None)
    assert (v2.branch, v2.pin, v2.before) == ("releases/v2", "v2.0", "good")
    level = v2.pin_level
    assert (level.neighbour, level.old, level.new, level.mode, level.culprit, level.reused) == (
        "releases/v1", "v1.0", "v2.0", "find-fix", world["a"]["a4"], False)
    assert level.answer == f"first good {world['a']['a4'][:12]} (v2.0~2) AITER a4 (#4)"
    runs, executions = stored(tmp_path)
    [inside] = [row for row in runs if row["id"] in level.runs]
    params = json.loads(inside["params"])
    assert (inside["kind"], inside["status"], params["parent_run"], params["level"]) == ("bisect", "finished",
                                                                                         result.run_id, 2)
    inside_result = json.loads(inside["result"])
    assert inside_result["level"]["held_commit"] == v2.tip and inside_result["culprit"]["sha"] == world["a"]["a4"]

    said = f"releases/v1 → this branch moves AITER v1.0 → v2.0; inside AITER: {level.answer}"
    row = next(row for row in runs if row["id"] == result.run_id)
    for fmt in ("text", "markdown", "html", "junit"):
        assert said in report.render(row, fmt), fmt
    published = json.loads(report.render(row, "json"))
    assert published["branches"][1]["pin_level"]["culprit"] == world["a"]["a4"]
    assert "pin_level" not in published["branches"][0]

    again = backport(world, tmp_path)
    assert again.run_id != result.run_id and again.executions == 0
    reused = again.branches[1].pin_level
    assert (reused.culprit, reused.runs, reused.answer, reused.reused) == (level.culprit, level.runs, level.answer,
                                                                           True)
    runs_after, executions_after = stored(tmp_path)
    assert executions_after == executions  # nothing judged again
    assert [row["kind"] for row in runs_after] == [row["kind"] for row in runs] + ["backport"]  # no new level
    assert f"inside AITER (reused from run {result.run_id}): first good" in backport_report.backport_text(again)

    fresh = backport(world, tmp_path, no_cache=True)  # --no-cache asks again
    assert not fresh.branches[1].pin_level.reused and fresh.branches[1].pin_level.culprit == world["a"]["a4"]


def test_no_level_where_the_pins_or_the_verdicts_agree(tmp_path):
    world = flip_world(tmp_path)
    git(world["vllm"], "branch", "releases/v0", world["c1"])  # pins v1.0 like releases/v1, tests bad like it
    result = backport(world, tmp_path)
    assert [entry.branch for entry in result.branches] == ["releases/v0", "releases/v1", "releases/v2"]
    assert [entry.pin_level is not None for entry in result.branches] == [False, False, True]
    plain = run_backport(BackportConfig(repo=world["vllm"], fix=world["fix"], branches=["releases/*"],
                                        scenario=PinnedState({"aiter_repo": str(world["aiter"])}),
                                        state_dir=tmp_path / "state"))
    assert all(entry.pin_level is None for entry in plain.branches)  # without --follow-pins: nothing followed


def test_cli_backport_follow_pins_with_the_real_probe_at_gfx950(tmp_path, cli):
    pytest.importorskip("torch")
    from test_aiter_mla_probe_pins import commit_all, make_aiter, make_vllm, write_tree

    aiter, vllm = tmp_path / "aiter", tmp_path / "vllm"
    aiter_shas, vllm_shas = make_aiter(aiter), make_vllm(vllm)  # c0 v1.0, c1 docs, c2 bumps to v2.0
    git(vllm, "branch", "releases/v1", vllm_shas["c0"])
    git(vllm, "branch", "releases/v2", vllm_shas["c2"])
    git(vllm, "checkout", "-q", "-b", "fixed", vllm_shas["c1"])
    write_tree(vllm, "fixed")
    fix = commit_all(vllm, "[ROCm] Size the MLA metadata by the query's dtype")
    env = {**os.environ, "BISECTOR_AITER_CACHE": str(tmp_path / "cache")}
    out = cli("backport", "--repo", str(vllm), "--fix", fix, "--branches", "releases/*", "--scenario",
              "aiter-mla-probe", "--option", "arch=gfx950", "--option", f"aiter_repo={aiter}", "--follow-pins",
              "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "out.json"), env=env, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr  # releases/v2 is masked: a branch that needs work
    v1, v2 = json.loads((tmp_path / "out.json").read_text())["branches"]
    assert (v1["verdict"], v2["verdict"], v1.get("pin_level")) == ("verified", "masked", None)
    assert (v2["pin_level"]["culprit"], v2["pin_level"]["mode"]) == (aiter_shas["v2.0"], "find-fix")
    assert f"inside AITER: first good {aiter_shas['v2.0'][:12]} (v2.0) AITER v2.0" in out.stdout


def test_cli_backport_follow_pins_without_a_scenario_is_a_usage_error(tmp_path, cli):
    world = flip_world(tmp_path)
    before = git(world["vllm"], "for-each-ref")
    out = cli("backport", "--repo", str(world["vllm"]), "--fix", world["fix"], "--branches", "releases/*",
              "--follow-pins", "--state-dir", str(tmp_path / "state"))
    assert (out.returncode, out.stderr) == (2, "bisector: error: --follow-pins judges AITER commits with the "
                                               "scenario: give --scenario NAME\n")
    assert git(world["vllm"], "for-each-ref") == before


def test_plan_with_follow_pins_shows_each_pin_change_and_the_second_levels_cost(tmp_path):
    from bisector.engine.config import RunConfig
    from bisector.engine.planning import plan_bisection
    from bisector.world.world import WorldSettings

    world = flip_world(tmp_path)  # releases/v2: c0 (v1.0), c1 docs, c2 bumps to v2.0; AITER a2..a6 after v1.0
    bump = git(world["vllm"], "rev-parse", "releases/v2")

    def plan(aiter_repo: str = str(world["aiter"]), **settings):
        return plan_bisection(RunConfig(repo=world["vllm"], good="releases/v1", bad="releases/v2",
                                        scenario=PinnedState({"aiter_repo": aiter_repo}),
                                        state_dir=tmp_path / "state", **settings))

    assert plan().pin_levels == ()  # only asked with --follow-pins
    [line] = plan(follow_pins=True).pin_levels
    assert line == (f"{bump[:12]} moves AITER v1.0 → v2.0: 5 AITER commits after v1.0 up to v2.0 (ancestor); "
                    f"level 2: about 5 steps (2 ends, then bisection)")
    # a scenario that reads AITER's source itself judges AITER commits as they are: the first level's --aiter
    # pinned installs nothing inside AITER (an AITER commit pins no AITER), so no builds are counted there
    assert plan(follow_pins=True, world=WorldSettings(aiter="pinned")).pin_levels == (line,)
    assert tables.plan_text(plan(follow_pins=True)).splitlines()[-1] == f"follow-pins: {line}"
    assert json.loads(json.dumps(plan(follow_pins=True).to_json()))["pin_levels"] == [line]

    docs_only = plan_bisection(RunConfig(repo=world["vllm"], good="releases/v1", bad=world["c1"],
                                         scenario=PinnedState({"aiter_repo": str(world["aiter"])}),
                                         state_dir=tmp_path / "state", follow_pins=True))
    assert docs_only.pin_levels == ("no AITER pin change in the range: an answer there would have no second level",)
    elsewhere = plan("https://aiter.invalid/aiter.git", follow_pins=True)
    assert elsewhere.pin_levels == (f"{bump[:12]} moves AITER v1.0 → v2.0: AITER commits between the pins not "
                                    f"counted (https://aiter.invalid/aiter.git is not local: give --aiter-repo a "
                                    f"clone)",)
