"""`bisector backport --follow-pins` of the real fix (vLLM PR 47276) onto releases/v0.20 and v0.21 at gfx950:
v0.20 is verified (its tip bad), v0.21 masked (AITER v0.1.13 sizes both query dtypes alike there: its tip good),
and the pin moves v0.1.10.post3 → v0.1.13 between them, so the level inside ROCm/aiter, v0.21's tip held, names
the AITER commit that changes the verdict: 5e4c537c6b26 "Fold qh128 to qh16 in gfx950 (#2204)" (one run here:
91 s, with the clone of ROCm/aiter).

Needs the release repository (BISECTOR_RELEASE_REPO, see tests/test_backport_real.py) and a ROCm/aiter clone
(BISECTOR_AITER_REPO); skipped without them."""
from __future__ import annotations

import json

import pytest
from test_backport_real import AITER, needs_real, releases  # noqa: F401 - the module fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LINES = ["releases/v0.20", "releases/v0.21"]


@needs_real
def test_backport_follows_the_aiter_pin_at_gfx950(releases, tmp_path, cli):  # noqa: F811
    proc = cli("backport", "--repo", str(releases), "--fix", "fix-47276", "--branches", *LINES[:1], "--branches",
               LINES[1], "--scenario", "aiter-mla-probe", "--option", "arch=gfx950", "--option",
               f"aiter_repo={AITER}", "--follow-pins", "--state-dir", str(tmp_path / "state"), "--json",
               str(tmp_path / "out.json"), env={"BISECTOR_AITER_CACHE": str(tmp_path / "aiter-cache")},
               timeout=1800)
    result = json.loads((tmp_path / "out.json").read_text())
    v20, v21 = result["branches"]
    assert (v20["pin"], v20["verdict"], v21["pin"], v21["verdict"]) == ("v0.1.10.post3", "verified", "v0.1.13",
                                                                         "masked"), proc.stdout + proc.stderr
    level = v21["pin_level"]
    assert (level["old"], level["new"], level["mode"]) == ("v0.1.10.post3", "v0.1.13", "find-fix")
    assert level["culprit"].startswith("5e4c537c6b26"), level["answer"]  # what run --follow-pins finds too
    assert level["answer"].endswith(" Fold qh128 to qh16 in gfx950 (#2204)")
    assert f"inside AITER: {level['answer']}" in proc.stdout


@needs_real
def test_the_plan_of_a_gpu_follow_pins_hunt_on_the_real_repositories_counts_its_aiter_builds(releases, tmp_path,  # noqa: F811
                                                                                            cli):
    """The GPU scenario's plan over real v0.18.0..v0.24.0 with the AITER mirror given by --aiter-repo (no
    --aiter pinned: the second level installs AITER per commit anyway): each of the three pin moves counted in
    ROCm/aiter's own history, with the AITER builds its level would make. Nothing runs (no GPU here)."""
    proc = cli("run", "--plan", "--repo", str(releases), "--good", "v0.18.0", "--bad", "v0.24.0", "--scenario",
               "dpa-fp8-kv-graph-capture", "--follow-pins", "--aiter-repo", str(AITER), "--state-dir",
               str(tmp_path / "state"), "--json", str(tmp_path / "plan.json"))
    assert proc.returncode == 0, proc.stderr
    levels = json.loads((tmp_path / "plan.json").read_text())["pin_levels"]
    assert [line.split(": ")[0].split(" moves AITER ")[1] for line in levels] == [
        "v0.1.10.post2 → v0.1.10.post3", "v0.1.10.post3 → v0.1.13", "v0.1.13 → v0.1.13.post1"]
    assert "473 AITER commits after v0.1.10.post3 up to v0.1.13 (equivalent); level 2: about 12 steps" in levels[1]
    for line in levels:
        assert "AITER installed per commit: about " in line and " AITER builds, one per AITER commit tested" in line
