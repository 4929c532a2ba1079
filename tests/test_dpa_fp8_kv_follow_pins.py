"""`run --follow-pins` with dpa-fp8-kv-graph-capture: the GPU scenario's second level. A vLLM-shaped history
(the fake vLLM package of tests/fakes/vllm.py) moves its AITER pin between two tags of a stand-in AITER
package whose graph capture "faults" from a known commit on; the fake vLLM reads that flag from the AITER it
imports. Both levels run the real child against a fake /dev, /sys tree and a fake ROCm torch, each AITER commit
built into a wheel and installed into a layer for real (bisector.world.aiter, as `--aiter pinned` does)."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from dpa_fp8_kv_records import FAULT, ROCM_SELECTED
from fakes.containers import FakeDocker, image_key
from fakes.machine import mi300x_machine
from fakes.vllm import ROCM_TORCH_FILES, write_files
from fakes.vllm import fake_vllm as fake_vllm_package
from follow_pins_world import killed_when_blocked, stand_in_aiter

from bisector import builds
from bisector.builds import BuildSettings, parse_size
from bisector.builds.artifacts import ArtifactCache
from bisector.builds.base import COMPILE_COST, BuildResult, Decision, keep_outputs
from bisector.engine.config import RunConfig
from bisector.engine.follow import pin_follow_up
from bisector.engine.run import run_bisection
from bisector.errors import ScenarioError
from bisector.process import Cancelled
from bisector.record.store import Store
from bisector.repo.refs import GitRepo
from bisector.report import renderers as report
from bisector.world.aiter import AiterSettings
from bisector.world.images import LAYER_REPOSITORY, OWNER_LABEL, REVISION_LABEL, ImageSettings, expand
from bisector.world.place import StepAt
from bisector.world.world import WorldSettings
from scenarios import create
from scenarios.base import StepContext, Verdict
from scenarios.dpa_fp8_kv.scenario import DpaFp8KvScenario

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = "dpa-fp8-kv-graph-capture"
TEMPLATE = "rocm/vllm-ci:{commit}"
# The fake vLLM's engine: graph capture "faults" (the recorded ROCm fault, then SIGABRT) when the AITER it
# imports says so, or when this vLLM commit itself is broken. With $BLOCK_HELD set, the third run of a held vLLM
# (a step inside AITER) says so there and waits until killed.
ENGINE = '''
    import os, sys, time

    def capture(self_fault):
        import aiter
        block = os.environ.get("BLOCK_HELD")
        if block and "/src/vllm-" in __file__:
            count = len(os.listdir(block)) + 1
            open(os.path.join(block, "held-%d" % count), "w").close()
            if count == 3:
                open(os.path.join(block, "blocked"), "w").close()
                time.sleep(600)
        if self_fault or aiter.GRAPH_CAPTURE_FAULTS:
            print({fault!r}, file=sys.stderr, flush=True)
            os.abort()
'''.format(fault=ROCM_SELECTED + "\n" + FAULT)


# A vLLM with a compiled part: its engine imports vllm/_C, which no commit holds and only its build writes.
NATIVE = {"setup.py": "from setuptools import setup\nsetup(name='vllm')\n", "csrc/ops.c": "/* vLLM's kernels */\n"}


def fake_vllm(self_fault: bool, native: bool = False) -> dict[str, str]:
    files = fake_vllm_package(selected="INFO Using AITER MLA backend.", on_start="vllm.engine.capture:capture",
                              on_start_args=(self_fault,))
    files["vllm/engine/capture.py"] = textwrap.dedent(ENGINE).replace(
        "import aiter\n", "import aiter\n    from vllm import _C  # the compiled part: the build's\n" if native
        else "import aiter\n")
    if native:
        files |= NATIVE
    return files


@pytest.fixture
def world(make_repo, tmp_path, monkeypatch, wheel_build):
    """AITER a1 (v0.1.12) .. a4 (v0.1.13), graph capture faulting from a3 on; vLLM v0..v3 moving the pin at
    v2 (which also breaks vLLM itself when the test asks); a fake / with two gfx942 GPUs; a fake ROCm torch."""
    aiter = make_repo("aiter")
    a = stand_in_aiter(aiter, 4, "GRAPH_CAPTURE_FAULTS", flagged_from=3)
    monkeypatch.setattr(DpaFp8KvScenario, "system_root", mi300x_machine(tmp_path / "root"))
    monkeypatch.setenv("PYTHONPATH", str(write_files(tmp_path / "site", ROCM_TORCH_FILES)))
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(tmp_path / "vllm-record.json"))

    def vllm_history(broken_at_bump: bool, pinned_repo: str | None = None, native: bool = False) -> list[str]:
        """vLLM v0..v3 pinning AITER in pinned_repo (default: the local AITER repository); native: with a compiled
        part (setup.py, csrc/) its engine imports, which only a build writes (StandInBuild)."""
        vllm = make_repo("vllm")
        shas = []
        for i in range(4):
            pin, source = "v0.1.12" if i < 2 else "v0.1.13", pinned_repo or aiter.path
            shas.append(vllm.commit(f"vLLM change {i}", {
                "docker/Dockerfile.rocm_base": f'ARG AITER_BRANCH="{pin}"\nARG AITER_REPO="{source}"\n',
                **fake_vllm(broken_at_bump and i >= 2, native), "n": f"{i}\n"}))
        return [vllm.path, *shas]

    vllm_history.aiter_path = aiter.path  # type: ignore[attr-defined]
    return a, vllm_history


# The hunt in a process of its own (to be killed), with the fake / of the world fixture: argv REPO GOOD BAD STATE ROOT.
RUNNER = f"""
import json, sys
from pathlib import Path
from bisector.world.aiter import AiterSettings
from bisector.engine.config import RunConfig
from bisector.engine.follow import pin_follow_up
from bisector.engine.run import run_bisection
from bisector.world.world import WorldSettings
from bisector.errors import ScenarioError
from scenarios import create
from scenarios.base import StepContext, Verdict
from scenarios.dpa_fp8_kv.scenario import DpaFp8KvScenario

repo, good, bad, state, root = sys.argv[1:]
DpaFp8KvScenario.system_root = Path(root)
result = run_bisection(RunConfig(repo=Path(repo), good=good, bad=bad, state_dir=Path(state), follow_pins=True,
                                 scenario=create({NAME!r}, {{"max_num_seqs": "4"}}),
                                 world=WorldSettings(aiter="pinned")))
print(json.dumps(result.to_json(published=True)))
sys.exit(result.exit_code)
"""


def hunt(vllm: list, tmp_path: Path, world: WorldSettings | None = None):
    repo, *v = vllm
    return run_bisection(RunConfig(repo=repo, good=v[0], bad=v[-1], scenario=create(NAME, {"max_num_seqs": "4"}),
                                   state_dir=tmp_path / "state", follow_pins=True,
                                   world=world or WorldSettings(aiter="pinned")))


def test_the_second_level_installs_each_aiter_commit_under_the_held_vllm(world, tmp_path):
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False)
    result = hunt([repo, *v], tmp_path)
    assert result.culprit.sha == v[2], [(s.sha[:8], s.verdict, s.reason) for s in result.steps]
    assert (result.pin_change.old, result.pin_change.new) == ("v0.1.12", "v0.1.13")
    assert result.follow_notes == ()
    [inside] = result.levels
    assert inside.culprit is not None, [(s.sha[:8], s.verdict, s.reason) for s in inside.steps]
    assert inside.culprit.sha == a[3] and inside.level.held_commit == v[2] and inside.level.how == "ancestor"
    assert {step.sha for step in inside.steps if step.role == "endpoint"} == {a[1], a[4]}
    for step in inside.steps:  # each step ran the held vLLM against its own AITER commit, installed in a layer
        assert step.details["aiter"]["commit"] == step.sha and step.details["aiter"]["ref"] == step.sha
        assert step.details["held_vllm"] == {"repo": str(repo), "ref": v[2], "pins_aiter": "v0.1.13",
                                             "aiter_installed": "0.1.13" if step.sha == a[4] else "0.1.12"}
        assert step.details["attention_backend"] == "ROCM_AITER_MLA"
        assert step.details["held_build"] == {  # the first level built nothing: the held commit's sources, as said
            "commit": v[2], "found": False, "native": None,
            "said": "held build not found: the first level built nothing (--build none): the held commit's sources "
                    "alone"}
        assert step.verdict == ("bad" if step.sha in (a[3], a[4]) else "good"), (step.sha, step.reason)
    bad = next(step for step in inside.steps if step.sha == a[4])
    assert "Memory access fault by GPU" in bad.reason or "SIGABRT" in bad.reason, bad.reason
    state = tmp_path / "state"
    wheels = sorted(p.name for p in (state / "aiter" / "builds").glob("*/dist/*.whl"))
    assert len(wheels) == len({step.sha for step in inside.steps})  # one wheel per AITER commit, a1/a4 reused
    assert len(list((state / "logs").rglob("build-*-aiter-wheel.log"))) == len(wheels)

    with Store(state / "bisector.sqlite") as store:
        stored = {row["id"]: row for row in store.runs()}
    shown = report.render(stored[result.run_id], "text")
    assert shown.startswith(f"answer: vLLM {v[2][:12]} ") and f"inside AITER: first bad {a[3][:12]}" in shown
    published = json.loads(report.render(stored[result.run_id], "json"))
    assert published["levels"][1]["first_bad"]["sha"] == a[3]


def test_the_continuation_printed_is_the_gpu_level_itself_and_the_cli_runs_it_so(world, tmp_path, cli):
    """The hand-run continuation of a GPU hunt names this scenario, its options and the level's world options (not
    the CPU probe); given to the real CLI, each step installs the AITER commit it checks out, as the level does."""
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False)
    aiter = tmp_path / "aiter"  # make_repo("aiter") of the world fixture
    change = pin_follow_up(GitRepo(repo), v[2], RunConfig(repo=repo, good=v[0], bad=v[-1], scenario=create(
        NAME, {"max_num_seqs": "4"}), world=WorldSettings(aiter="installed")))
    assert change.continuation == (
        f"bisector run --repo {aiter} --good v0.1.12 --bad v0.1.13 --state-dir {GitRepo(repo).common_dir / 'bisector'} "
        f"--scenario {NAME} --option max_num_seqs=4 "
        f"--option vllm_ref={v[2]} --option vllm_repo={repo} --aiter pinned")
    image = pin_follow_up(GitRepo(repo), v[2], RunConfig(repo=repo, good=v[0], bad=v[-1], scenario=create(
        NAME, {}), world=WorldSettings(ImageSettings(TEMPLATE), aiter_settings=AiterSettings(arch="gfx950")),
        find_fix=True))
    assert image.continuation.endswith(f"--image '{TEMPLATE}' --rocm-arch gfx950")
    assert " --find-fix --repo " in image.continuation and "--good v0.1.13 --bad v0.1.12" in image.continuation

    plan = tmp_path / "plan.json"
    out = cli(*shlex.split(change.continuation)[1:], "--plan", "--json", str(plan), "--state-dir",
              str(tmp_path / "state"))
    assert out.returncode == 0, out.stderr
    probes = json.loads(plan.read_text())["probes"]
    assert {probe["sha"] for probe in probes} >= {a[1], a[4]}
    for probe in probes:  # the commit checked out is the AITER installed (not a pin read from an AITER tree)
        assert probe["world"].startswith(f"AITER {probe['sha'][:10]} for "), probe["world"]
    out = cli(*shlex.split(change.continuation)[1:], "--aiter", "installed", "--plan")
    assert (out.returncode, out.stderr) == (2, f"bisector: error: scenario {NAME} holding vLLM at vllm_ref judges "
                                               f"AITER commits: each step installs the one it checks out (--aiter "
                                               f"pinned, or --image: inside the held image)\n")


def test_a_held_vllm_that_faults_on_its_own_stops_the_level(world, tmp_path):
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=True)
    result = hunt([repo, *v], tmp_path)
    assert result.culprit.sha == v[2]
    [inside] = result.levels
    assert inside.culprit is None and inside.stopped.startswith("not explained by AITER alone: ")
    assert f"AITER v0.1.12 ({a[1][:12]}) tests bad" in inside.stopped


def images_of(docker: FakeDocker, vllm: list, a: dict) -> dict[str, str]:
    """Each vLLM commit's image (as vLLM's AMD CI pushes them): the fake vLLM, the fake ROCm torch and the AITER
    it pins (v0.1.12 = a1, v0.1.13 = a4: faulting), the commit in its revision label. Returns ref by commit."""
    repo, *v = vllm
    refs = {}
    for i, sha in enumerate(v):
        faults, version = (False, "0.1.12") if i < 2 else (True, "0.1.13")
        site = {**fake_vllm(False), **ROCM_TORCH_FILES,
                "aiter/__init__.py": f"GRAPH_CAPTURE_FAULTS = {faults}\nCOMMIT = {1 if i < 2 else 4}\n",
                f"amd_aiter-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: amd-aiter\n"
                                                           f"Version: {version}\n"}
        refs[sha] = expand(TEMPLATE, sha)
        docker.add_image(refs[sha], site, labels={REVISION_LABEL: sha},
                         env={"FAKE_VLLM_RECORD": os.environ["FAKE_VLLM_RECORD"]})
    return refs


def test_with_image_each_aiter_commit_is_layered_over_the_held_commits_image(world, tmp_path, monkeypatch, cli):
    a, vllm_history = world
    docker = FakeDocker(tmp_path / "fake")
    docker.activate(monkeypatch)
    repo, *v = vllm = vllm_history(broken_at_bump=False)
    refs = images_of(docker, vllm, a)
    result = hunt(vllm, tmp_path, WorldSettings(ImageSettings(TEMPLATE)))
    assert result.culprit and result.culprit.sha == v[2], [(s.sha[:8], s.verdict, s.reason) for s in result.steps]
    [inside] = result.levels
    assert inside.culprit is not None, [(s.sha[:8], s.verdict, s.reason) for s in inside.steps]
    assert inside.culprit.sha == a[3] and inside.level.held_commit == v[2]
    layered = {}
    for step in inside.steps:  # the held commit's image, with the step's AITER commit built and installed in it
        assert step.details["aiter"]["commit"] == step.sha, step.reason
        assert step.details["image"]["ref"] == refs[v[2]] and step.details["image"]["layered"].startswith(
            f"{LAYER_REPOSITORY}:")
        assert step.details["held_vllm"]["aiter_installed"] == ("0.1.13" if step.sha == a[4] else "0.1.12")
        assert step.verdict == ("bad" if step.sha in (a[3], a[4]) else "good"), (step.sha, step.reason)
        layered[step.sha] = step.details["image"]["layered"]
    assert len(set(layered.values())) == len(layered)  # one image per AITER commit

    # the fake runtime's record: each layer built in a container of the held image (by its id), then committed
    held_id = json.loads((docker.home / "local" / f"{image_key(refs[v[2]])}.json").read_text())["Id"]
    builds = [call for call in docker.runs() if "bisector-aiter-image" in call]
    assert len(builds) == len(layered)
    for call in builds:
        assert call[call.index("--entrypoint") + 2] == held_id and "--rm" not in call
    commits = [call for call in docker.calls() if call[:1] == ["commit"]]
    assert sorted(call[-1] for call in commits) == sorted(layered.values())
    assert all(f'LABEL {OWNER_LABEL}="bisector"' in call for call in commits)
    for sha, ref in layered.items():  # the tool's own image, labelled so, with the AITER commit and base in it
        image = json.loads((docker.home / "local" / f"{image_key(ref)}.json").read_text())
        assert image["Config"]["Labels"][OWNER_LABEL] == "bisector"
        assert image["Config"]["Labels"]["org.bisector.world.aiter.commit"] == sha
        assert image["Config"]["Labels"][REVISION_LABEL] == v[2]  # still the held vLLM commit's image
        steps = [call for call in docker.runs() if held_id not in call and image["Id"] in call]
        assert steps, f"no step ran in {ref}"
    with Store(tmp_path / "state" / "bisector.sqlite") as store:
        mine = {row["ref"] for row in store.pulled_images()}
    assert set(layered.values()) <= mine  # recorded as the tool's own: pruned as the images it pulled

    # the same hunt again: every layer is there, nothing built again, every verdict from the cache
    docker.clear_calls()
    again = hunt(vllm, tmp_path, WorldSettings(ImageSettings(TEMPLATE)))
    assert again.levels[0].culprit.sha == a[3]
    assert not [call for call in docker.calls() if call[:1] == ["commit"]]

    # the continuation printed is this level with --image; the real CLI plans it as layered over the held image
    assert result.pin_change.continuation.endswith(f"--option vllm_repo={repo} --image '{TEMPLATE}'")
    plan = tmp_path / "plan.json"
    out = cli(*shlex.split(result.pin_change.continuation)[1:], "--plan", "--json", str(plan), "--state-dir",
              str(tmp_path / "state"), env=docker.env)
    assert out.returncode == 0, out.stderr
    for probe in json.loads(plan.read_text())["probes"]:
        assert probe["world"] == f"AITER {probe['sha'][:12]} built and installed over image {refs[v[2]]} (the " \
                                 f"held vLLM commit's)"


def test_a_layer_that_cannot_be_built_is_a_skip_with_its_reason(world, tmp_path, monkeypatch, make_repo):
    a, vllm_history = world
    docker = FakeDocker(tmp_path / "fake")
    docker.activate(monkeypatch)
    repo, *v = vllm = vllm_history(broken_at_bump=False)
    images_of(docker, vllm, a)
    held = create(NAME, {"max_num_seqs": "4"}).follow_up("aiter").hold(str(repo), v[2])
    first = WorldSettings(ImageSettings(TEMPLATE))
    level = first.for_level(held, v[2])
    assert level.aiter_at_step and level.image is first.image and level.held_commit == v[2]
    probe = create("aiter-mla-probe", {})
    assert probe.aiter_sensitive is False  # it reads AITER's source itself: no image, no AITER install inside AITER
    for world_asked in (first, WorldSettings(aiter="pinned"), WorldSettings()):
        assert world_asked.for_level(probe, v[2]) == WorldSettings()
    aiter = make_repo("broken-aiter")  # an AITER commit whose setup.py fails inside the image
    broken = aiter.commit("AITER broken", {"setup.py": "raise SystemExit('no hipcc in this image')\n",
                                           "requirements.txt": "torch==2.9.0\n"})
    (tmp_path / "state").mkdir()
    opened = level.open(GitRepo(aiter.path), tmp_path / "state")
    opened.resolve([broken])
    step = StepAt(broken, aiter.path, tmp_path / "logs")
    with opened.enter(step, None, sys.executable) as place:
        assert not place.ok and "no hipcc in this image" in place.reason and "exited 1" in place.reason
        assert place.details["aiter"]["commit"] == broken
    assert not [call for call in docker.calls() if call[:1] == ["commit"]]
    assert "torch" not in (Path(place.log_path).read_text())  # the image's torch left alone (requirement dropped)
    built = len([call for call in docker.runs() if "bisector-aiter-image" in call])
    with opened.enter(step, None, sys.executable) as again:  # remembered: skipped at once, with the same log
        assert not again.ok and "failed to build in the image before" in again.reason
        assert again.log_path == place.log_path
    assert len([call for call in docker.runs() if "bisector-aiter-image" in call]) == built

    fine = level.open(GitRepo(tmp_path / "aiter"), tmp_path / "state")  # a build cancelled is not remembered
    fine.resolve([a[1]])
    cancelled = threading.Event()
    cancelled.set()
    at = StepAt(a[1], tmp_path / "aiter", tmp_path / "logs", cancel=cancelled)
    with pytest.raises(Cancelled), fine.enter(at, None, sys.executable):
        pass
    with fine.enter(dataclasses.replace(at, cancel=None), None, sys.executable) as place:
        assert place.ok and place.details["image"]["layered"].startswith(LAYER_REPOSITORY), place.reason
    layered = place.details["image"]["layered"]
    docker.add_image(layered, {}, local=True)  # someone else's image under that name: never taken, never removed
    with fine.enter(dataclasses.replace(at, cancel=None), None, sys.executable) as place:
        assert not place.ok and place.reason.startswith(f"image {layered} is there but not the layer bisector made")
    assert docker.is_local(layered) and ["image", "rm", layered] not in [call[:3] for call in docker.calls()]

    docker.remove_from_registry(expand(TEMPLATE, v[1]))  # a held commit without an image: nothing to layer over
    without = first.for_level(held, v[1]).open(GitRepo(aiter.path), tmp_path / "state")
    without.resolve([broken])
    with without.enter(step, None, sys.executable) as place:
        assert not place.ok and place.reason == (f"held vLLM {v[1][:12]}: no image {expand(TEMPLATE, v[1])}: no "
                                                 f"image to install AITER {broken[:12]} in")


def test_a_kill_inside_the_gpu_level_resumes_there(world, tmp_path, wait_for):
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False)
    block = tmp_path / "block"
    block.mkdir()
    state = tmp_path / "state"
    project = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-c", RUNNER, str(repo), v[0], v[-1], str(state), str(DpaFp8KvScenario.system_root)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), os.environ["PYTHONPATH"]])}
    killed_when_blocked(argv, {**env, "BLOCK_HELD": str(block)}, block, wait_for, 300)  # at the third step inside AITER
    with Store(state / "bisector.sqlite") as store:
        before = {row["id"]: row for row in store.runs()}
    [second_level] = [row for row in before.values() if json.loads(row["params"]).get("parent_run")]
    assert second_level["status"] == "running"

    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    first, inside = json.loads(again.stdout)["levels"]
    assert first["executions"] == 0  # every verdict of the first level from the cache
    assert inside["resumed_from"] == second_level["id"] and inside["culprit"]["sha"] == a[3]
    assert len([step for step in inside["steps"] if step["cached"]]) == 2  # the ends; the killed step ran again


def test_held_vllm_options_are_checked_and_a_missing_held_commit_is_a_skip(tmp_path, make_repo):
    with pytest.raises(ScenarioError, match="options vllm_repo and vllm_ref go together"):
        create(NAME, {"vllm_repo": str(tmp_path)})
    with pytest.raises(ScenarioError, match="option vllm_ref='--all': a ref cannot start with '-'"):
        create(NAME, {"vllm_repo": str(tmp_path), "vllm_ref": "--all"})
    vllm = make_repo("vllm")
    vllm.commit("vLLM", {"vllm/__init__.py": ""})
    held = create(NAME, {}).follow_up("aiter").hold(str(vllm.path), "f" * 40)
    ctx = StepContext(checkout=tmp_path, log_path=tmp_path / "logs/step.log", python=sys.executable)
    outcome = held.run(ctx)
    assert outcome.verdict is Verdict.SKIP and outcome.reason == f"held vLLM: vLLM ref {'f' * 40} not found in " \
                                                                  f"{vllm.path}"
    assert held.machine_check(ctx) == outcome.reason


def test_the_plan_of_a_gpu_hunt_counts_the_aiter_builds_of_its_second_level(world, tmp_path, cli):
    """The GPU scenario's level installs AITER per commit whatever --aiter the first level has: the plan says
    so without --aiter pinned (and with --image, layered over the held commit's image)."""
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False)
    bump = f"{v[2][:12]} moves AITER v0.1.12 → v0.1.13: 3 AITER commits after v0.1.12 up to v0.1.13 (ancestor); " \
           f"level 2: about 4 steps (2 ends, then bisection)"
    plan = tmp_path / "plan.json"
    out = cli("run", "--plan", "--json", str(plan), "--repo", str(repo), "--good", v[0], "--bad", v[-1],
              "--scenario", NAME, "--follow-pins", "--state-dir", str(tmp_path / "state"))
    assert out.returncode == 0, out.stderr
    line = bump + "; AITER installed per commit: about 4 AITER builds, one per AITER commit tested (JIT, ~5 min " \
                  "each unless cached)"
    held = f"; held vLLM {v[2][:12]}: its sources alone (no setup.py at this commit)"  # this fake vLLM builds nothing
    assert json.loads(plan.read_text())["pin_levels"] == [line + held]
    assert f"follow-pins: {line}{held}" in out.stdout

    docker = FakeDocker(tmp_path / "fake")
    images_of(docker, [repo, *v], a)
    out = cli("run", "--plan", "--json", str(plan), "--repo", str(repo), "--good", v[0], "--bad", v[-1],
              "--scenario", NAME, "--follow-pins", "--state-dir", str(tmp_path / "state"), "--image", TEMPLATE,
              env=docker.env)
    assert out.returncode == 0, out.stderr
    assert json.loads(plan.read_text())["pin_levels"] == [line.replace(
        "AITER installed per commit:", "AITER installed per commit, each layered over the held commit's image:") +
        f"; held vLLM {v[2][:12]}: every step in its image {expand(TEMPLATE, v[2])} (in the registry: pulled for the "
        f"first step), which holds its build, with the step's AITER commit built and layered over it"]


UNREACHABLE_AITER = "https://aiter.invalid/ROCm/aiter.git"  # what the Dockerfile pins; never reachable here


def test_aiter_repo_serves_the_second_level_when_the_pinned_repository_is_out_of_reach(world, tmp_path, cli):
    """An air-gapped ROCm box: the Dockerfile pins AITER upstream, the user has a mirror. --aiter-repo is
    taken with --follow-pins for the GPU scenario (whose level installs AITER per commit) and the level, its
    plan and its hand-run continuation all use the mirror instead of reaching for the pinned URL."""
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False, pinned_repo=UNREACHABLE_AITER)
    mirror = str(vllm_history.aiter_path)
    plan = tmp_path / "plan.json"
    out = cli("run", "--plan", "--json", str(plan), "--repo", str(repo), "--good", v[0], "--bad", v[-1],
              "--scenario", NAME, "--follow-pins", "--aiter-repo", mirror, "--state-dir", str(tmp_path / "plan-state"))
    assert out.returncode == 0, out.stderr
    [level] = json.loads(plan.read_text())["pin_levels"]
    assert level.startswith(f"{v[2][:12]} moves AITER v0.1.12 → v0.1.13: 3 AITER commits after v0.1.12 up to "
                            f"v0.1.13 (ancestor)"), level
    result = hunt([repo, *v], tmp_path, WorldSettings(aiter="pinned", aiter_settings=AiterSettings(repo=mirror)))
    assert result.culprit.sha == v[2] and result.follow_notes == ()
    [inside] = result.levels
    assert inside.culprit is not None and inside.culprit.sha == a[3], [(s.sha[:8], s.reason) for s in inside.steps]
    continuation = shlex.split(result.pin_change.continuation)
    assert continuation[continuation.index("--repo") + 1] == mirror and UNREACHABLE_AITER not in continuation


def test_aiter_repo_without_a_level_that_uses_it_is_still_refused(world, tmp_path, cli):
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False)
    out = cli("run", "--plan", "--repo", str(repo), "--good", v[0], "--bad", v[-1], "--scenario", NAME,
              "--aiter-repo", str(vllm_history.aiter_path), "--state-dir", str(tmp_path / "state"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("bisector: error: --aiter-repo needs --aiter pinned")


class StandInBuild:
    """A build strategy defined here: "compiles" a vLLM commit by writing vllm/_C.py (its compiled part, which
    no commit holds), kept in the artifact cache by native hash as vLLM's source build keeps its .so files."""

    name = "stand-in"
    cost = COMPILE_COST / 2  # cheaper than the source build, dearer than reusing stored artifacts

    def __init__(self, context):
        self.cache = context.cache

    def can_serve(self, target):
        return Decision(self.name, f"compiled {target.short}", target.native)

    def prepare(self, target, decision, log_dir):
        (target.worktree / "vllm" / "_C.py").write_text(f"NATIVE = {target.native!r}\n")
        return keep_outputs(self.cache, target, BuildResult(self.name, True, decision.reason, None, target.env))


def built_hunt(vllm: list, tmp_path: Path):
    """hunt, the first level building each vLLM commit (--build auto: the stand-in build, then reuse)."""
    repo, *v = vllm
    return run_bisection(RunConfig(repo=repo, good=v[0], bad=v[-1], scenario=create(NAME, {"max_num_seqs": "4"}),
                                   state_dir=tmp_path / "state", follow_pins=True, world=WorldSettings(aiter="pinned"),
                                   builder=BuildSettings("auto", sys.executable)))


def test_the_second_level_runs_the_held_commit_with_the_build_the_first_level_stored(world, tmp_path, monkeypatch):
    """vLLM with a compiled part: the first level builds its commits (one native hash: built once, then reused);
    the level inside AITER runs the held commit's tree with that build restored from the artifact cache, so the
    held vLLM imports its compiled part and the level finds the AITER commit."""
    monkeypatch.setitem(builds.REGISTRY, StandInBuild.name, StandInBuild)
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False, native=True)
    result = built_hunt([repo, *v], tmp_path)
    assert result.culprit.sha == v[2], [(s.sha[:8], s.verdict, s.reason) for s in result.steps]
    built = [step.build for step in result.steps]
    assert [b.split(":")[0] for b in built].count("stand-in") == 1 and any("1 files reused" in b for b in built)
    [inside] = result.levels
    assert inside.culprit is not None, [(s.sha[:8], s.verdict, s.reason, s.details.get("held_build"))
                                        for s in inside.steps]
    assert inside.culprit.sha == a[3]
    [native] = [p.name for p in (tmp_path / "state" / "artifacts").iterdir()]
    tree = tmp_path / "state" / "held" / f"{v[2]}-{native[:16]}"
    for step in inside.steps:  # each step: the held commit's tree with its compiled part, said in its details
        assert step.details["held_build"] == {"commit": v[2], "found": True, "native": native,
                                              "said": f"native {native[:12]} built before (stand-in), 1 files reused"}
        assert step.verdict == ("bad" if step.sha in (a[3], a[4]) else "good"), (step.sha, step.reason)
    assert (tree / "vllm" / "_C.py").read_text() == f"NATIVE = {native!r}\n"
    stored = tmp_path / "state" / "artifacts" / native / "vllm" / "_C.py"  # linked, not a second copy of the build
    assert (tree / "vllm" / "_C.py").stat().st_ino == stored.stat().st_ino
    assert (tree / "vllm" / "engine" / "capture.py").is_file() and (tree / "docker" / "Dockerfile.rocm_base").is_file()
    assert not (tree / "csrc").exists()  # the held package and its pins, not the whole tree


def test_a_held_commit_without_a_stored_build_says_so_and_runs_its_sources(world, tmp_path, monkeypatch):
    """The held commit's build evicted from the artifact cache: each level step says the held build was not found
    and runs the held commit's sources alone, as before (this vLLM cannot import its compiled part there); the
    level is asked again (its verdict cache key says which held build), not served the verdicts it had with it."""
    monkeypatch.setitem(builds.REGISTRY, StandInBuild.name, StandInBuild)
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False, native=True)
    first = built_hunt([repo, *v], tmp_path)
    assert first.levels[0].culprit.sha == a[3]
    state = tmp_path / "state"
    [native] = [p.name for p in (state / "artifacts").iterdir()]
    other = tmp_path / "other"  # another build stored past a 1-byte --cache-size evicts the held commit's
    (other / "vllm").mkdir(parents=True)
    (other / "vllm" / "_C.py").write_text("NATIVE = 'other'\n")
    ArtifactCache(state, parse_size("1")).save("o" * 64, other, ["vllm/_C.py"], "stand-in", None)
    assert [p.name for p in (state / "artifacts").iterdir()] == ["o" * 64]

    again = built_hunt([repo, *v], tmp_path)
    assert again.culprit.sha == v[2] and again.executions == 0  # the first level's verdicts from the cache
    [inside] = again.levels
    assert inside.steps and not any(step.cached for step in inside.steps)
    for step in inside.steps:
        assert step.details["held_build"] == {
            "commit": v[2], "found": False, "native": None,
            "said": f"held build not found: native {native[:12]} of {v[2][:12]} never stored here: not built, built "
                    f"by a strategy that keeps no artifacts, or evicted past --cache-size: its sources alone"}
        assert "cannot import name '_C' from 'vllm'" in Path(step.log).read_text(), step.reason
    assert inside.culprit is None and inside.stopped
