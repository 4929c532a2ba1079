"""The held vLLM commit's build in a level inside AITER that --follow-pins does not run itself, and in its plan.

Run by hand, the GPU scenario's continuation (given to the real CLI) names the first level's state dir, and its steps
get the held commit's tree with the build the first level stored there (restored from the artifact cache, as the
automatic level does), or one line before the run starts says why not; the world of
tests/test_dpa_fp8_kv_follow_pins.py: a fake vLLM whose graph capture faults with the AITER it imports (AITER a3
on), AITER built and installed per commit for real, a fake / with two gfx942 GPUs (the CLI below runs with it) and
a fake ROCm torch. `run --plan --follow-pins` says whether that build will be there: stored already, built by the
first level, or none (--build none)."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.containers import FakeDocker
from test_dpa_fp8_kv_follow_pins import NAME, TEMPLATE, StandInBuild, world  # noqa: F401 - the fixture

from bisector import builds
from bisector.builds import BuildSettings, parse_size
from bisector.builds.artifacts import ArtifactCache
from bisector.builds.builder import Builder, NoBuild
from bisector.engine.config import RunConfig
from bisector.engine.follow import held_by_hand, pin_follow_up
from bisector.engine.run import run_bisection
from bisector.record.steps import Handler
from bisector.repo.refs import GitRepo
from bisector.world.images import REVISION_LABEL, ImageSettings, expand
from bisector.world.world import WorldSettings
from scenarios import create
from scenarios.dpa_fp8_kv.scenario import DpaFp8KvScenario

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
# The real CLI (bisector.cli.main) with the fake / of the world fixture: argv ROOT ARGS...
CLI = """
import sys
from pathlib import Path
from scenarios.dpa_fp8_kv.scenario import DpaFp8KvScenario
from bisector.cli import main
DpaFp8KvScenario.system_root = Path(sys.argv[1])
main(sys.argv[2:], prog_name="bisector")
"""


def run_by_hand(continuation: str, *extra: str) -> subprocess.CompletedProcess:
    """The continuation as a user runs it (plus extra options), on the fake / and fake torch of the world."""
    argv = shlex.split(continuation)
    assert argv[:2] == ["bisector", "run"], argv
    site = os.environ["PYTHONPATH"]  # the fake ROCm torch (the world fixture)
    return subprocess.run([sys.executable, "-c", CLI, str(DpaFp8KvScenario.system_root), *argv[1:], *extra],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), site])})


def said_before_the_run(stderr: str, line: str) -> None:
    """line is said once, before the run's first line (not per step)."""
    lines = stderr.splitlines()
    assert lines.count(line) == 1, stderr
    started = next(n for n, text in enumerate(lines) if text.startswith("run ") and "commits in range" in text)
    assert lines.index(line) < started, stderr


@pytest.mark.slow
def test_by_hand_the_held_build_the_first_level_stored_is_restored(world, tmp_path, monkeypatch):  # noqa: F811
    """vLLM with a compiled part only its build writes: the first level (no --follow-pins) builds and stores it;
    its continuation, run by hand, holds the answer with that build restored from the same state dir, so the held
    vLLM imports its compiled part and the level finds the AITER commit; the automatic level is then served its
    verdicts (the same question)."""
    monkeypatch.setitem(builds.REGISTRY, StandInBuild.name, StandInBuild)
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False, native=True)
    state = tmp_path / "state"
    asked = RunConfig(repo=repo, good=v[0], bad=v[-1], scenario=create(NAME, {"max_num_seqs": "4"}), state_dir=state,
                      world=WorldSettings(aiter="pinned"), builder=BuildSettings("auto", sys.executable))
    first = run_bisection(asked)
    assert first.culprit.sha == v[2] and not first.levels, [(s.sha[:8], s.verdict, s.reason) for s in first.steps]
    continuation = first.pin_change.continuation
    assert f" --state-dir {state} " in continuation  # the first level's record and artifact cache
    [native] = [path.name for path in (state / "artifacts").iterdir()]

    report = tmp_path / "level.json"
    out = run_by_hand(continuation, "--json", str(report))
    said = f"native {native[:12]} built before (stand-in), 1 files reused"
    said_before_the_run(out.stderr, f"held vLLM {v[2][:12]}: {said}")
    level = json.loads(report.read_text())
    assert out.returncode == 0 and level["first_bad"]["sha"] == a[3], (out.stderr, level.get("stopped"))
    for step in level["steps"]:  # each step ran the held commit's tree with its build, as the automatic level's do
        assert step["details"]["held_build"] == {"commit": v[2], "found": True, "native": native, "said": said}
    tree = state / "held" / f"{v[2]}-{native[:16]}"
    assert (tree / "vllm" / "_C.py").read_text() == f"NATIVE = {native!r}\n"

    # the automatic level asks the same question (one verdict cache key): --follow-pins is served the hand-run's
    again = run_bisection(dataclasses.replace(asked, follow_pins=True))
    [inside] = again.levels
    assert inside.culprit.sha == a[3] and inside.steps and all(step.cached for step in inside.steps), \
        [(step.sha[:8], step.cached, step.reason) for step in inside.steps]


@pytest.mark.slow
def test_by_hand_without_a_stored_build_one_line_says_why_and_the_held_sources_run(world, tmp_path):  # noqa: F811
    """Nothing stored for the held commit (it has no setup.py: nothing to build): one line before the run says so,
    each step's details too, and the held commit's sources alone serve (this vLLM has no compiled part)."""
    a, vllm_history = world
    repo, *v = vllm_history(broken_at_bump=False)
    state = tmp_path / "state"
    change = pin_follow_up(GitRepo(repo), v[2], RunConfig(repo=repo, good=v[0], bad=v[-1], state_dir=state,
                                                          scenario=create(NAME, {"max_num_seqs": "4"})))
    report = tmp_path / "level.json"
    out = run_by_hand(change.continuation, "--json", str(report))
    said = "held build not found: no setup.py at the held commit (nothing to build): its sources alone"
    said_before_the_run(out.stderr, f"held vLLM {v[2][:12]}: {said}")
    level = json.loads(report.read_text())
    assert out.returncode == 0 and level["first_bad"]["sha"] == a[3], (out.stderr, level.get("stopped"))
    for step in level["steps"]:
        assert step["details"]["held_build"] == {"commit": v[2], "found": False, "native": None, "said": said}


def pinned_vllm(make_repo):
    """An AITER history (a1 v1.0 .. a3 v3.0) and a vLLM one with a compiled part (setup.py, csrc/) whose v2 moves
    its AITER pin v1.0 → v3.0: the vLLM repository and its four commits. Nothing here runs."""
    aiter = make_repo("aiter")
    for n in range(1, 4):
        aiter.commit(f"AITER a{n}", {"aiter/__init__.py": f"COMMIT = {n}\n"})
        if n in (1, 3):
            aiter.git("tag", f"v{n}.0")
    vllm = make_repo("vllm")
    return vllm, [vllm.commit(f"vLLM change {i}", {
        "docker/Dockerfile.rocm_base": f'ARG AITER_BRANCH="{pin}"\nARG AITER_REPO="{aiter.path}"\n',
        "setup.py": "from setuptools import setup\nsetup(name='vllm')\n", "csrc/ops.c": f"/* kernels {i} */\n",
        "vllm/__init__.py": f"CHANGE = {i}\n"}) for i, pin in enumerate(["v1.0", "v1.0", "v3.0", "v3.0"])]


def test_the_continuation_names_the_first_levels_python_as_the_level_runs_with_it(make_repo, tmp_path):
    """The level runs with the first level's --python (the toolchain the held build's native hash names): its
    continuation names it, unless it is this interpreter (the default)."""
    vllm, v = pinned_vllm(make_repo)
    python = str(tmp_path / "rocm-venv" / "bin" / "python")
    asked = RunConfig(repo=vllm.path, good=v[0], bad=v[-1], state_dir=tmp_path / "state", python=python,
                      scenario=create(NAME, {}))
    argv = shlex.split(pin_follow_up(GitRepo(vllm.path), v[2], asked).continuation)
    assert argv[argv.index("--python") + 1] == python and argv[argv.index("--state-dir") + 1] == str(tmp_path / "state")
    default = pin_follow_up(GitRepo(vllm.path), v[2], dataclasses.replace(asked, python=sys.executable))
    assert "--python" not in shlex.split(default.continuation)


def test_the_plan_of_a_gpu_follow_pins_hunt_says_whether_the_held_build_will_be_restored(make_repo, tmp_path, cli,
                                                                                           monkeypatch):
    """Each follow-pins line of the plan says what the level holding that commit gets: its build built by the first
    level (nothing stored yet), stored already, or its sources alone with --build none; nothing is run."""
    vllm, v = pinned_vllm(make_repo)
    state = tmp_path / "state"

    def planned(*extra: str) -> str:
        plan = tmp_path / "plan.json"
        out = cli("run", "--plan", "--json", str(plan), "--repo", str(vllm.path), "--good", v[0], "--bad", v[-1],
                  "--scenario", NAME, "--follow-pins", "--state-dir", str(state), *extra)
        assert out.returncode == 0, out.stderr
        [level] = json.loads(plan.read_text())["pin_levels"]
        assert level.startswith(f"{v[2][:12]} moves AITER v1.0 → v3.0: 2 AITER commits after v1.0 up to v3.0"), level
        assert level in out.stdout
        return level

    held = f"held vLLM {v[2][:12]}: "
    assert planned("--build", "source").endswith(held + "built by the first level (source), then restored for each "
                                                        "step")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the CLI's own: the same toolchain, the same native hash
    native = Builder(BuildSettings("auto", sys.executable), GitRepo(vllm.path), state, builds.REGISTRY).native(v[2])
    built = tmp_path / "built"
    (built / "vllm").mkdir(parents=True)
    (built / "vllm" / "_C.so").write_text("compiled\n")
    ArtifactCache(state, parse_size("1G")).save(native, built, ["vllm/_C.so"], "source", None)  # the first level's
    assert planned().endswith(held + f"its build stored already (native {native[:12]}, source), restored for each "
                                     f"step")
    assert planned("--build", "none").endswith(held + "its sources alone (--build none: the first level builds "
                                                      "nothing)")


class Heard(Handler):
    """The lines a run's handler is told at the start of a level (what the CLI prints)."""

    def __init__(self):
        self.lines: list[str] = []

    def level(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.parametrize("case", ["build none", "a URL", "an unknown commit"])
def test_by_hand_a_held_build_that_cannot_be_looked_for_says_why_in_one_line(make_repo, tmp_path, case):
    """Set up as the CLI sets up a hand-run continuation (the held scenario's world for_level): --build none, a
    vllm_repo that is no local repository, or a vllm_ref it does not have leave the held commit's sources alone,
    said once; the level builds nothing of its AITER checkouts either way, as the automatic level."""
    vllm, v = pinned_vllm(make_repo)
    repo, ref = {"a URL": ("https://vllm.invalid/vllm.git", v[2]), "an unknown commit": (str(vllm.path), "f" * 40)
                 }.get(case, (str(vllm.path), v[2]))
    held = create(NAME, {"vllm_repo": repo, "vllm_ref": ref})
    cfg = RunConfig(repo=tmp_path / "aiter", good="v1.0", bad="v3.0", scenario=held,
                    world=WorldSettings(aiter="pinned").for_level(held, ref),
                    builder=BuildSettings("none" if case == "build none" else "auto", sys.executable))
    heard = Heard()
    with held_by_hand(cfg, tmp_path / "state", heard) as level:
        why = {"build none": "held build not looked for (--build none): its sources alone",
               "a URL": "held build not looked for: not a git repository: https://vllm.invalid/vllm.git (the builds "
                        "are found in a local vllm_repo): its sources alone",
               "an unknown commit": f"held build not looked for: unknown ref: {'f' * 40} (the builds are found in a "
                                    f"local vllm_repo): its sources alone"}[case]
        assert heard.lines == [f"held vLLM {ref[:12]}: {why}"]
        assert level.world.held_build.path is None and level.world.held_build.said == why
        assert isinstance(level.builder, NoBuild)
    assert not (tmp_path / "state" / "held").exists()



def test_the_plan_of_a_continuation_run_by_hand_says_what_its_held_build_will_be(make_repo, tmp_path, cli,
                                                                                    monkeypatch):
    """`--plan` on the GPU scenario's continuation itself (a level run by hand): its AITER checkouts are not built
    (each step installs its AITER commit), and one line says what the held vLLM commit will run with: its build
    restored from the state dir the continuation names, or why not (nothing stored there yet, --build none, a ref
    vllm_repo does not have); the plan restores nothing."""
    vllm, v = pinned_vllm(make_repo)
    state = tmp_path / "state"
    asked = RunConfig(repo=vllm.path, good=v[0], bad=v[-1], state_dir=state, scenario=create(NAME, {}))
    continuation = shlex.split(pin_follow_up(GitRepo(vllm.path), v[2], asked).continuation)
    assert f"vllm_ref={v[2]}" in continuation and continuation[continuation.index("--state-dir") + 1] == str(state)

    def held_line(*argv: str) -> str:
        plan = tmp_path / "plan.json"
        out = cli(*argv[1:], "--plan", "--json", str(plan))
        assert out.returncode == 0, out.stderr
        planned = json.loads(plan.read_text())
        assert planned["builder"] == "none" and out.stdout.splitlines()[0].endswith(" --build none")
        assert {probe["build"] for probe in planned["probes"]} == {"none"}  # AITER installed by each step, not built
        assert planned["held_build"] in out.stdout.splitlines()
        return planned["held_build"]

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the CLI's own: the same toolchain, the same native hash
    native = Builder(BuildSettings("auto", sys.executable), GitRepo(vllm.path), state, builds.REGISTRY).native(v[2])
    held = f"held vLLM {v[2][:12]}: "
    assert held_line(*continuation) == held + f"its sources alone (native {native[:12]} not stored in this state " \
                                              f"dir: run the first level with this --state-dir first)"
    built = tmp_path / "built"
    (built / "vllm").mkdir(parents=True)
    (built / "vllm" / "_C.so").write_text("compiled\n")
    ArtifactCache(state, parse_size("1G")).save(native, built, ["vllm/_C.so"], "source", None)  # the first level's
    assert held_line(*continuation) == held + f"its build stored already (native {native[:12]}, source), " \
                                              f"restored for each step"
    assert held_line(*continuation, "--build", "none") == held + "its sources alone (--build none: no held build " \
                                                                 "looked for)"
    unknown = [f"vllm_ref={'f' * 40}" if arg == f"vllm_ref={v[2]}" else arg for arg in continuation]
    assert held_line(*unknown) == f"held vLLM {'f' * 12}: its sources alone (held build not looked for: unknown " \
                                  f"ref: {'f' * 40}; the builds are found in a local vllm_repo)"
    assert not (state / "held").exists()  # nothing restored for a plan



def test_the_plan_of_a_continuation_with_image_runs_every_step_in_the_held_commits_image(make_repo, tmp_path, cli):
    """`--plan` on the continuation of a level with --image: every step runs in the held vLLM commit's image with its
    AITER commit layered over it, so the plan counts no images of the AITER commits (they have none of their own)
    and says which image the steps run in: here, to pull, or missing (then every step would skip, and a warning says
    what to do)."""
    vllm, v = pinned_vllm(make_repo)
    docker = FakeDocker(tmp_path / "fake")
    asked = RunConfig(repo=vllm.path, good=v[0], bad=v[-1], state_dir=tmp_path / "state", scenario=create(NAME, {}),
                      world=WorldSettings(ImageSettings(TEMPLATE)))
    continuation = shlex.split(pin_follow_up(GitRepo(vllm.path), v[2], asked).continuation)
    assert continuation[-2:] == ["--image", TEMPLATE]

    def planned(state: str) -> dict:
        plan = tmp_path / "plan.json"  # a state dir each: the record keeps the runtime's answers
        out = cli(*continuation[1:], "--plan", "--json", str(plan), "--state-dir", str(tmp_path / state),
                  env=docker.env)
        assert out.returncode == 0, out.stderr
        data = json.loads(plan.read_text())
        first = out.stdout.splitlines()[0]
        assert data["imaged"] is None and first == f"plan: {data['commits']} commits in range, --build none", first
        assert data["held_build"] in out.stdout.splitlines()
        assert [f"warning: {warning}" for warning in data["warnings"]] == \
            [line for line in out.stdout.splitlines() if line.startswith("warning: ")]
        return data

    held, ref = f"held vLLM {v[2][:12]}: ", expand(TEMPLATE, v[2])
    missing = planned("none")
    assert missing["held_build"] == held + f"no image {ref}: every step would skip (no image to layer its AITER " \
                                           f"commit over)"
    assert missing["warnings"] == [f"the held vLLM commit {v[2][:12]} has no image (no image {ref}): every step "
                                   f"would skip; push or pull the image --image names for it, or give --aiter pinned "
                                   f"instead of --image (the level on this machine)"]
    docker.add_image(ref, {}, labels={REVISION_LABEL: v[2]})
    layered = "which holds its build, with the step's AITER commit built and layered over it"
    pulled = planned("registry")
    assert pulled["held_build"] == held + f"every step in its image {ref} (in the registry: pulled for the first " \
                                          f"step), {layered}"
    assert pulled["warnings"] == []
    docker.make_local(ref)
    assert planned("here")["held_build"] == held + f"every step in its image {ref} (here), {layered}"


def test_the_plan_of_a_follow_pins_hunt_with_image_names_the_held_commits_image(make_repo, tmp_path, cli):
    """`--plan --follow-pins --image` of the GPU scenario: the pin change's line says the level's steps run in the held
    commit's image (here, to pull, or missing: every step of the level would skip)."""
    vllm, v = pinned_vllm(make_repo)
    docker = FakeDocker(tmp_path / "fake")

    def level_line(state: str) -> str:
        plan = tmp_path / "plan.json"
        out = cli("run", "--plan", "--json", str(plan), "--repo", str(vllm.path), "--good", v[0], "--bad", v[-1],
                  "--scenario", NAME, "--follow-pins", "--image", TEMPLATE,
                  "--state-dir", str(tmp_path / state), env=docker.env)
        assert out.returncode == 0, out.stderr
        [level] = json.loads(plan.read_text())["pin_levels"]
        assert level.startswith(f"{v[2][:12]} moves AITER v1.0 → v3.0: 2 AITER commits after v1.0 up to v3.0"), level
        assert "AITER installed per commit, each layered over the held commit's image: " in level
        assert f"follow-pins: {level}" in out.stdout.splitlines()
        return level

    held, ref = f"; held vLLM {v[2][:12]}: ", expand(TEMPLATE, v[2])
    assert level_line("none").endswith(held + f"no image {ref}: every step would skip (no image to layer its AITER "
                                              f"commit over)")
    docker.add_image(ref, {}, labels={REVISION_LABEL: v[2]})
    layered = "which holds its build, with the step's AITER commit built and layered over it"
    assert level_line("registry").endswith(held + f"every step in its image {ref} (in the registry: pulled for the "
                                                  f"first step), {layered}")
    docker.make_local(ref)
    assert level_line("here").endswith(held + f"every step in its image {ref} (here), {layered}")


def test_by_hand_with_image_one_line_says_which_image_every_step_runs_in(make_repo, tmp_path, cli):
    """The continuation of a level with --image, run by hand: one line before the run starts says what its steps run
    in, as its plan does: the held vLLM commit's image (here, or pulled from the registry for the first step) with
    each AITER commit layered over it, or no such image: every step will skip, and what to do."""
    vllm, v = pinned_vllm(make_repo)
    docker = FakeDocker(tmp_path / "fake")
    asked = RunConfig(repo=vllm.path, good=v[0], bad=v[-1], state_dir=tmp_path / "state", scenario=create(NAME, {}),
                      world=WorldSettings(ImageSettings(TEMPLATE)))
    continuation = shlex.split(pin_follow_up(GitRepo(vllm.path), v[2], asked).continuation)

    def said(state: str) -> str:
        """The line said of the held commit by the continuation run in a state dir of its own (the record keeps
        the runtime's answers)."""
        out = cli(*continuation[1:], "--state-dir", str(tmp_path / state), env=docker.env)
        assert "Traceback" not in out.stderr, out.stderr
        [line] = [line for line in out.stderr.splitlines() if line.startswith(f"held vLLM {v[2][:12]}: ")]
        said_before_the_run(out.stderr, line)
        return line

    held, ref = f"held vLLM {v[2][:12]}: ", expand(TEMPLATE, v[2])
    assert said("none") == held + f"no image {ref}: every step will skip (no image to layer its AITER commit over); " \
                                  f"push or pull the image --image names for it, or give --aiter pinned instead of " \
                                  f"--image (the level on this machine)"
    docker.add_image(ref, {}, labels={REVISION_LABEL: v[2]})
    layered = "which holds its build, with the step's AITER commit built and layered over it"
    assert said("registry") == held + f"every step in its image {ref} (in the registry: pulled for the first step), " \
                                      f"{layered}"
    docker.make_local(ref)
    assert said("here") == held + f"every step in its image {ref} (here), {layered}"
