"""`scenario run|calibrate` build as `run` does (--wheels asks for a build), calibrate shows its progress,
`run --plan` warns about what this machine lacks and sums its estimate, and a skip's log path exists."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from fakes.containers import FakeDocker
from test_images import TEMPLATE, history, publish

pytestmark = pytest.mark.integration

GPU_SCENARIO = "dpa-fp8-kv-graph-capture"
no_gpu_here = pytest.mark.skipif(os.path.exists("/dev/kfd") or os.path.exists("/dev/nvidiactl"),
                                 reason="this machine has a GPU: the GPU scenario could run")

# A vLLM-shaped tree whose `setup.py develop` builds nothing but a record of the wheel it was given: what the
# precompiled build runs (VLLM_USE_PRECOMPILED=1), without a compiler.
FAKE_SETUP = '''\
import os
import pathlib
pathlib.Path("built.txt").write_text(os.environ.get("VLLM_PRECOMPILED_WHEEL_LOCATION", "no wheel"))
'''
# A scenario that needs a built tree: good when the build left its record, bad when the tree was not built.
BUILT_SCENARIO = '''\
from pathlib import Path

from scenarios.base import BaseScenario, Outcome, Verdict


class NeedsBuilt(BaseScenario):
    name, description = "needs-built", "good when the tree was built (built.txt), bad when not"
    needs_build = True

    def run(self, ctx):
        built = Path(ctx.checkout) / "built.txt"
        ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
        ctx.log_path.write_text(built.read_text() if built.exists() else "not built\\n")
        return Outcome(Verdict.GOOD, "built", str(ctx.log_path)) if built.exists() else \\
            Outcome(Verdict.BAD, "not built", str(ctx.log_path))
'''


def buildable_tree(repo) -> list[str]:
    """Two commits of a tree `--build auto` recognises (setup.py and the vllm package)."""
    first = repo.commit("tree", {"setup.py": FAKE_SETUP, "vllm/__init__.py": "", ".gitignore": "built.txt\n"})
    return [first, repo.commit("change", {"vllm/work.py": "x = 1\n"})]


def wheels_for(shas: list[str], where: Path) -> Path:
    """A --wheels dir with a (placeholder) wheel for each commit: DIR/<sha>/*.whl."""
    for sha in shas:
        (where / sha).mkdir(parents=True)
        (where / sha / "vllm-0-cp38-abi3-linux_x86_64.whl").write_text("placeholder")
    return where


@pytest.fixture
def plugin_env(tmp_path) -> dict:
    """PYTHONPATH holding the needs-built scenario, declared by an entry point as a plug-in is."""
    site = tmp_path / "site"
    (site / "needs_built_scenario-0.dist-info").mkdir(parents=True)
    (site / "needs_built_scenario.py").write_text(BUILT_SCENARIO)
    (site / "needs_built_scenario-0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: needs-built-scenario\nVersion: 0\n")
    (site / "needs_built_scenario-0.dist-info" / "entry_points.txt").write_text(
        "[bisector.scenarios]\nneeds-built = needs_built_scenario:NeedsBuilt\n")
    root = Path(__file__).resolve().parents[1]
    return {"PYTHONPATH": f"{root}{os.pathsep}{site}"}


def test_scenario_run_builds_a_named_scenario_by_default_and_wheels_ask_for_a_build(make_repo, tmp_path, cli,
                                                                                   plugin_env):
    repo = make_repo()
    shas = buildable_tree(repo)
    wheels = wheels_for(shas, tmp_path / "wheels")
    before = repo.snapshot()
    named = cli("scenario", "run", "needs-built", "--repo", str(repo.path), "--ref", shas[-1],
                "--wheels", str(wheels), "--python", sys.executable, "--state-dir", str(tmp_path / "state"),
                "--json", str(tmp_path / "named.json"), env=plugin_env)
    assert named.returncode == 0, (named.stdout, named.stderr)
    outcome = json.loads((tmp_path / "named.json").read_text())
    assert outcome["verdict"] == "good" and outcome["cache_key"]["build"] == "auto", outcome
    assert Path(outcome["log"]).read_text() == str((wheels / shas[-1]).resolve() / "vllm-0-cp38-abi3-linux_x86_64.whl")

    # a -- CMD builds for itself, as with `run` ... unless --wheels asks for a build
    for extra, code in (((), 1), (("--wheels", str(wheels)), 0)):
        proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", shas[0], "--python",
                   sys.executable, "--state-dir", str(tmp_path / "state"), *extra, "--", "test", "-f", "built.txt")
        assert proc.returncode == code, (extra, proc.stdout, proc.stderr)
    refused = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", shas[0], "--build", "none",
                  "--wheels", str(wheels), "--state-dir", str(tmp_path / "state"), "--", "true")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "bisector: error: --wheels asks for a build: drop --build none (or the wheels)"]
    assert repo.snapshot() == before


def test_scenario_calibrate_builds_and_shows_each_step_as_it_lands(make_repo, tmp_path, cli, plugin_env):
    repo = make_repo()
    shas = buildable_tree(repo)
    repo.git("tag", "v0.1", shas[0])
    wheels = wheels_for(shas, tmp_path / "wheels")
    proc = cli("scenario", "calibrate", "needs-built", "--repo", str(repo.path), "--good", shas[0], "--bad",
               shas[-1], "--runs", "2", "--wheels", str(wheels), "--python", sys.executable,
               "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "c.json"), env=plugin_env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["good"]["runs"] == result["bad"]["runs"] == 2 and result["bad"]["bad"] == 0  # built: good
    lines = proc.stderr.splitlines()
    assert lines[0] == f"calibrating: 2 runs of each end, bad {shas[-1][:12]} (main) and good {shas[0][:12]} (v0.1)"
    landed = [line for line in lines if line.startswith("step ")]
    assert len(landed) == 4 and all(" good (built) [build " in line for line in landed), lines
    assert " [build precompiled: " in landed[0]  # then reused: the same native inputs
    logs = [line.removeprefix("  log: ") for line in lines if line.startswith("  log: ")]
    assert len(logs) == 4 and all(Path(log).is_file() for log in logs)


@no_gpu_here
def test_plan_warns_what_this_machine_lacks_and_sums_the_estimate(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = buildable_tree(repo) + repo.linear(4, bad_from=2)
    wheels = wheels_for(shas[:2], tmp_path / "wheels")  # a wheel for the first two commits only
    common = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--scenario", GPU_SCENARIO,
              "--aiter", "any", "--python", sys.executable, "--plan",
              "--state-dir", str(tmp_path / "state"))
    proc = cli(*common, "--build", "precompiled", "--wheels", str(wheels), "--json", str(tmp_path / "plan.json"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert lines[-len(warnings):] == warnings  # the plan's last lines
    [machine, wheel] = warnings
    # the venv's torch is a CPU build and this machine has no GPU: both in the scenario's own machine check
    assert machine.startswith(f"warning: this machine cannot run {GPU_SCENARIO}: no usable GPU (rocm: /dev/kfd "
                              "missing; cuda: /dev/nvidiactl missing; torch ")
    assert "neither a ROCm nor a CUDA build" in machine and "run on a machine with a ROCm or CUDA GPU" in machine
    plan = json.loads((tmp_path / "plan.json").read_text())
    unbuilt = [probe for probe in plan["probes"] if probe["build"] == "unavailable"]
    assert unbuilt and re.fullmatch(rf"warning: {len(unbuilt)} of {len(plan['probes'])} planned steps cannot be "
                                    r"built \([0-9a-f]{12}: no wheel for .*\): they would skip; give --wheels DIR .*",
                                    wheel), wheel
    assert plan["warnings"] == [line.removeprefix("warning: ") for line in warnings]
    assert all(probe["estimate"] for probe in plan["probes"])
    served = [probe for probe in plan["probes"] if probe["build"] == "precompiled"]
    assert served and all(probe["minutes"] == [2, 2] for probe in served)
    sure = [probe["minutes"] for probe in plan["probes"] if not probe["role"].startswith("probe 2 if ")]
    either = [probe["minutes"] for probe in plan["probes"] if probe["role"].startswith("probe 2 if ")]
    total = [sum(m[i] for m in sure) + max((m[i] for m in either), default=0) for i in (0, 1)]
    assert plan["minutes"] == total and total[0] > 0
    low, high = total
    assert f"estimate: {low if low == high else f'{low}-{high}'} min of builds, pulls and installs" in proc.stdout

    plain = cli(*common[:7], "--plan", "--state-dir", str(tmp_path / "state"), "--", "true")
    assert plain.returncode == 0 and "warning:" not in plain.stdout  # a command: nothing missing here
    assert "estimate: 0 min" in plain.stdout


def test_plan_warns_about_planned_steps_without_an_image(make_repo, tmp_path, cli):
    docker = FakeDocker(tmp_path / "fake")
    repo, shas = history(make_repo, count=6, culprit=3)
    publish(docker, shas, [0], culprit=3, local={0})  # the good end only
    args = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
            str(tmp_path / "state"), "--image", TEMPLATE, "--plan", "--json", str(tmp_path / "plan.json"))
    plan = cli(*args, "--", "python3", "tests/check.py", env=docker.env)
    assert plan.returncode == 0, plan.stderr
    probes = json.loads((tmp_path / "plan.json").read_text())["probes"]
    blind = [probe for probe in probes if probe["sha"] != shas[0]]
    assert blind and plan.stdout.splitlines()[-1] == (
        f"warning: {len(blind)} of {len(probes)} planned steps have no image ({blind[0]['sha'][:12]}: no image "
        f"{TEMPLATE.format(commit=blind[0]['sha'])}): they would skip; push or pull the images --image names, or "
        "give --image-fallback build to build those commits here")
    fallback = cli(*args, "--image-fallback", "build", "--", "python3", "tests/check.py", env=docker.env)
    assert fallback.returncode == 0 and "warning:" not in fallback.stdout, fallback.stdout
    assert not docker.runs()  # nothing ran


def test_a_skips_log_path_exists_and_holds_the_reason(make_repo, tmp_path, cli):
    repo = make_repo()
    sha = repo.commit("a script that is not executable", {"run.sh": "#!/bin/sh\nexit 0\n"})
    shas = buildable_tree(repo)
    state = tmp_path / "state"
    cannot_start = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--state-dir",
                       str(state), "--json", str(tmp_path / "o.json"), "--", "./run.sh")
    assert cannot_start.returncode == 125, cannot_start.stderr
    outcome = json.loads((tmp_path / "o.json").read_text())
    assert outcome["reason"].startswith("cannot start ") and outcome["reason"].endswith("Permission denied")
    assert f"log: {outcome['log']}" in cannot_start.stdout.splitlines()
    assert Path(outcome["log"]).read_text() == f"bisector: skip: {outcome['reason']}\n"

    # no wheel: the build fails before any log is written (no log shown); the probe gives up before its
    # process starts (its AITER cannot be cloned): every log a skip names exists and says why
    for logged, args in ((False, ("command", "--build", "precompiled", "--wheels", str(tmp_path), "--", "true")),
                         (True, ("aiter-mla-probe", "--option", f"aiter_repo={tmp_path / 'no-such-aiter'}",
                                 "--option", "aiter_ref=main"))):
        proc = cli("scenario", "run", *args[:1], "--repo", str(repo.path), "--ref", shas[-1], "--state-dir",
                   str(state), "--python", sys.executable, "--json", str(tmp_path / "s.json"), *args[1:])
        assert proc.returncode == 125, (args, proc.stdout, proc.stderr)
        skipped = json.loads((tmp_path / "s.json").read_text())
        shown = [line.removeprefix("log: ") for line in proc.stdout.splitlines() if line.startswith("log: ")]
        assert shown == ([skipped["log"]] if logged else []) and bool(skipped["log"]) == logged, (args, skipped)
        for log in shown:
            assert skipped["reason"] in Path(log).read_text()
