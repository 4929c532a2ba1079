"""An answer that moves the AITER pin says so, with the run that continues inside AITER."""
import json

import pytest

from bisector.engine.config import RunConfig
from bisector.engine.run import run_bisection
from bisector.seams import FollowUp
from scenarios.base import BaseScenario, Outcome, Verdict
from scenarios.command import CommandScenario

pytestmark = pytest.mark.integration

DOCKERFILE = "ARG BASE_IMAGE=rocm/dev-ubuntu-22.04\nARG AITER_BRANCH={}\nARG AITER_REPO=https://github.com/ROCm/aiter.git\n"


def test_a_culprit_that_bumps_the_aiter_pin_is_named_as_such(make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = [repo.commit(f"change {i}", {"docker/Dockerfile.rocm_base": DOCKERFILE.format(
        "v0.1.10.post3" if i < 5 else "v0.1.13"), "state": "good\n" if i < 5 else "bad\n"}) for i in range(8)]
    out = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"), "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"),
              "--", *state_is_good)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["first_bad"]["sha"] == shas[5]
    assert result["pin_change"] == {"name": "aiter", "from": "v0.1.10.post3", "to": "v0.1.13"}
    assert result["pin_continuation"].startswith(
        "bisector run --repo https://github.com/ROCm/aiter.git --good v0.1.10.post3 --bad v0.1.13 "
        "--scenario aiter-mla-probe")
    assert f"vllm_ref={shas[5]}" in result["pin_continuation"]
    for text in (out.stdout, (tmp_path / "r.md").read_text()):
        assert "this commit moves AITER v0.1.10.post3 → v0.1.13; the behaviour change may come from AITER" in text
    html = cli("report", "latest", "--repo", str(repo.path), "--state-dir", str(tmp_path / "state"),
               "--format", "html")
    assert "moves AITER v0.1.10.post3 → v0.1.13" in html.stdout

    cli("run", "--repo", str(repo.path), "--good", shas[5], "--bad", shas[-1], "--no-verify-endpoints",
                "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "q.json"), "--", "false")
    assert "pin_change" not in json.loads((tmp_path / "q.json").read_text())  # no move inside that range


def test_gpu_scenario_reports_an_aiter_other_than_the_pin(tmp_path):
    from scenarios.dpa_fp8_kv.environment import aiter_against_pin

    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile.rocm_base").write_text(DOCKERFILE.format("v0.1.13.post1"))
    assert aiter_against_pin(tmp_path, "0.1.13.post1+g3a38da3") == {"pinned": "v0.1.13.post1",
                                                                    "installed": "0.1.13.post1+g3a38da3"}
    assert aiter_against_pin(tmp_path, "0.1.10.post2")["mismatch"] == \
        "the checkout pins AITER v0.1.13.post1, the environment has 0.1.10.post2"
    assert aiter_against_pin(tmp_path / "docker", "0.1.10") == {}  # no pin there


class HeldAiter(BaseScenario):
    """Judges by the `state` file; continues inside AITER from its own mirror with its own option."""

    name = "held-aiter"
    needs_build = False

    def run(self, ctx):
        good = (ctx.checkout / "state").read_text().strip() == "good"
        return Outcome(Verdict.GOOD if good else Verdict.BAD, "state file")

    def follow_up(self, dependency):
        return FollowUp(repo="/mirror/aiter.git", options={"arch": "gfx950"}) if dependency == "aiter" else None


def test_the_continuation_keeps_what_the_scenarios_follow_up_says(make_repo, tmp_path):
    repo = make_repo()
    shas = [repo.commit(f"change {i}", {"docker/Dockerfile.rocm_base": DOCKERFILE.format(
        "v0.1.10.post3" if i < 3 else "v0.1.13"), "state": "good\n" if i < 3 else "bad\n"}) for i in range(6)]
    result = run_bisection(RunConfig(repo=repo.path, good=shas[0], bad=shas[-1], scenario=HeldAiter(),
                                     state_dir=tmp_path / "state"))
    assert result.culprit.sha == shas[3]
    assert (result.pin_change.name, result.pin_change.old, result.pin_change.new) == ("aiter", "v0.1.10.post3",
                                                                                      "v0.1.13")
    assert result.pin_change.continuation == (
        f"bisector run --repo /mirror/aiter.git --good v0.1.10.post3 --bad v0.1.13 --scenario aiter-mla-probe "
        f"--option vllm_repo={repo.path} --option vllm_ref={shas[3]} --option arch=gfx950")


def test_the_aiter_probe_carries_its_options_but_not_where_aiter_and_vllm_come_from():
    from scenarios import create

    probe = create("aiter-mla-probe", {"arch": "gfx950", "aiter_repo": "/mirror/aiter.git", "aiter_ref": "v1"})
    follow = probe.follow_up("aiter")
    assert follow.repo == "/mirror/aiter.git"
    assert dict(follow.options) == {"heads": "128", "kv_cache_dtype": "fp8", "arch": "gfx950", "max_num_seqs": "16"}
    assert probe.follow_up("triton") is None
    assert create("aiter-mla-probe").follow_up("aiter").repo is None  # the pin's repository, else upstream
    assert CommandScenario(["true"]).follow_up("aiter") is None
