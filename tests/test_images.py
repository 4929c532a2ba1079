"""--image: each commit judged in its own container image, through a fake `docker` (tests/fakes/docker) that
answers image inspect, manifest inspect and pull from a directory of fake images and runs `run` on this host.
Real git repositories, the real CLI, real SQLite; the containers' argv checked against vLLM's AMD runner flags.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.containers import RENDER_GID, FakeDocker, vllm_site

from bisector.world.images import (
    ImageIndex,
    ImageSettings,
    Runtime,
    amd_gpu_flags,
    check_template,
    expand,
    inside_gpu_env,
    pull_progress,
    slot_render_devices,
    topology_render_devices,
    write_pull_layers,
)

pytestmark = pytest.mark.integration

TEMPLATE = "rocm/vllm-ci:{commit}"
CULPRIT = 9
CHECK = ("import os, sys\n"
         "sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source, last\n"
         "import vllm\n"
         "print('vllm from', vllm.__file__, vllm.__version__)\n"
         "sys.exit(1 if vllm.BROKEN else 0)\n")
# vLLM's AMD test runner (.buildkite/scripts/hardware_ci/run-amd-test.sh and the launcher in examples/ci):
# /dev/kfd and the agent's render devices, the numeric render group and video, no core dumps, host IPC, 16g shm.
AMD_RUNNER_FLAGS = ["--device", "/dev/kfd", "--device", "/dev/dri/renderD128", "--device", "/dev/dri/renderD136",
                    "--group-add", RENDER_GID, "--group-add", "video", "--ulimit", "core=0", "--ipc=host",
                    "--shm-size=16g"]


@pytest.fixture
def docker(tmp_path):
    return FakeDocker(tmp_path / "fake")


def history(make_repo, count: int = 16, culprit: int = CULPRIT):
    """count commits of a vLLM-like tree whose vllm package is broken from commit `culprit` on."""
    repo = make_repo()
    shas = []
    for i in range(count):
        shas.append(repo.commit(f"change {i}", {"tests/check.py": CHECK, "counter.txt": f"{i}\n",
                                                "vllm/__init__.py": f"__version__ = 'src'\nBROKEN = {i >= culprit}\n"}))
    return repo, shas


def publish(docker: FakeDocker, shas: list[str], which, culprit: int = CULPRIT, local=()) -> None:
    """Images, built by 'CI', for the commits of `which` (indices); those in `local` are already here."""
    for i in which:
        docker.add_image(expand(TEMPLATE, shas[i]), vllm_site(f"0.9.{i}.dev0+g{shas[i][:9]}", i >= culprit),
                         labels={"org.opencontainers.image.revision": shas[i]}, local=i in local)


def bisect(cli, repo, shas, state, docker, *extra, json_file=None):
    args = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
            "--image", TEMPLATE, *extra]
    if json_file:
        args += ["--json", str(json_file)]
    return cli(*args, "--", "python3", "tests/check.py", env=docker.env)


def scenario_runs(docker: FakeDocker) -> list[list[str]]:
    return [argv for argv in docker.runs() if "tests/check.py" in argv]


def test_a_bisection_runs_every_step_in_its_commits_image_with_vllm_amd_flags(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    publish(docker, shas, range(16), local={0, 15})
    before = repo.snapshot()
    run = bisect(cli, repo, shas, tmp_path / "state", docker, json_file=tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["culprit"]["sha"] == shas[CULPRIT]
    assert repo.snapshot() == before
    runs = scenario_runs(docker)
    assert len(runs) == len(result["steps"])  # every step ran in a container; nothing ran on the host
    for argv in runs:
        image = argv[argv.index("--entrypoint") + 2]
        sha = next(s for s in shas if image == "sha256:" + json.loads(
            (docker.home / "registry" / f"rocm_vllm-ci_{s}.json").read_text())["digest"].split(":")[1][::-1])
        flags = argv[argv.index("--name") + 2:]
        assert flags[:len(AMD_RUNNER_FLAGS)] == AMD_RUNNER_FLAGS, flags
        after = flags[len(AMD_RUNNER_FLAGS):]
        assert after[:4] == ["--network", "none", "--user", f"{os.getuid()}:{os.getgid()}"]
        worktree = argv[argv.index("-w") + 1]
        assert f"{worktree}:{worktree}" in argv  # the checkout, mounted where it is
        assert not any(a.startswith(("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")) for a in argv)
        assert argv[argv.index("--entrypoint") + 1:] == ["python3", image, "tests/check.py"]
        step = next(s for s in result["steps"] if s["sha"] == sha)
        assert step["details"]["image"]["ref"] == expand(TEMPLATE, sha)
        assert step["details"]["image"]["vllm"].endswith(f"+g{sha[:9]}")
        assert step["build"].startswith(f"image: image {expand(TEMPLATE, sha)} (holds {sha[:12]}")
    logs = [Path(step["log"]).read_text() for step in result["steps"]]
    assert all(f"vllm from {docker.home / 'sites'}" in text for text in logs)  # the image's vLLM, not the source
    pulled = {call[1] for call in docker.calls() if call[0] == "pull"}
    assert expand(TEMPLATE, shas[0]) not in pulled and expand(TEMPLATE, shas[15]) not in pulled  # already here
    assert pulled and all(docker.is_local(ref) for ref in pulled)
    assert not any((docker.home / "containers").iterdir())  # every container removed


def test_commits_without_an_image_are_never_run_and_the_answer_is_the_range_between_imaged_ones(
        make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    publish(docker, shas, [i for i in range(16) if i % 2 == 0] + [15])  # the culprit (9) has no image
    run = bisect(cli, repo, shas, tmp_path / "state", docker, json_file=tmp_path / "r.json")
    assert run.returncode == 1, run.stderr  # inconclusive
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["culprit"] is None and result["candidates"] == [shas[9], shas[10]]
    tested = {step["sha"] for step in result["steps"]}
    assert all(i % 2 == 0 or i == 15 for i in (shas.index(sha) for sha in tested))
    (warning,) = [w for w in result["warnings"] if "no image" in w]
    assert f"between {shas[8][:12]} and {shas[10][:12]}" in warning and "--image-fallback build" in warning
    assert f"warning: {warning}" in run.stdout
    assert not any(shas[9] in " ".join(argv) for argv in docker.runs())


def test_an_endpoint_without_an_image_fails_the_endpoint_check_naming_it(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    publish(docker, shas, range(15))  # the bad end has none
    run = bisect(cli, repo, shas, tmp_path / "state", docker)
    assert run.returncode == 3, run.stderr
    assert f"bad {shas[-1]} ({shas[-1][:12]}) tested skip, not bad: no image {expand(TEMPLATE, shas[-1])}" \
        in run.stderr


def test_image_fallback_build_judges_the_commits_without_an_image_here(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    publish(docker, shas, [i for i in range(16) if i % 2 == 0] + [15])
    run = bisect(cli, repo, shas, tmp_path / "state", docker, "--image-fallback", "build",
                 json_file=tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["culprit"]["sha"] == shas[CULPRIT]
    culprit_step = next(s for s in result["steps"] if s["sha"] == shas[CULPRIT])
    assert culprit_step["details"]["image"] == {"ref": expand(TEMPLATE, shas[CULPRIT]), "present": False,
                                                "fallback": "build"}
    assert "vllm from" in Path(culprit_step["log"]).read_text() and "/vllm/__init__.py src" in \
        Path(culprit_step["log"]).read_text()  # the checkout's own source, run here
    assert not any(shas[CULPRIT] in " ".join(argv) for argv in docker.runs())


def test_the_search_prefers_imaged_commits_near_the_midpoint(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo, count=40, culprit=30)
    publish(docker, shas, [0, 18, 39], culprit=30)  # 19 (the midpoint) has none; 18 is within 10 %
    plan = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / "state"), "--image", TEMPLATE, "--image-fallback", "build", "--plan", "--json",
               str(tmp_path / "plan.json"), "--", "python3", "tests/check.py", env=docker.env)
    assert plan.returncode == 0, plan.stderr
    probes = json.loads((tmp_path / "plan.json").read_text())["probes"]
    (first,) = [p for p in probes if p["role"] == "probe 1"]
    assert first["sha"] == shas[18] and first["build"] == "image"
    assert first["world"] == f"image {expand(TEMPLATE, shas[18])} (in the registry, 6.0 MB: pulled)"
    assert first["estimate"] == "pull 6.0 MB (~1 min), no build"
    assert "plan: 39 commits in range, 2 of them with an image" in plan.stdout


def test_plan_says_per_step_which_image_and_whether_it_exists(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    publish(docker, shas, [0], local={0})
    plan = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / "state"), "--image", TEMPLATE, "--plan", "--", "python3", "tests/check.py",
               env=docker.env)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    good = lines.index(next(line for line in lines if "endpoint (good)" in line))
    assert lines[good + 1].strip() == f"image {expand(TEMPLATE, shas[0])} (here, 12.0 MB)"
    assert lines[good + 2].strip() == "cost: no build, no pull: the run only"
    bad = lines.index(next(line for line in lines if "endpoint (bad)" in line))
    assert lines[bad + 1].strip() == f"no image {expand(TEMPLATE, shas[-1])}: skip"
    assert not docker.runs()  # nothing ran


def test_an_image_that_is_not_the_commit_is_a_skip_naming_both(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    other = shas[3]
    docker.add_image(expand(TEMPLATE, shas[5]), vllm_site(f"0.9.3.dev0+g{other[:9]}", False))
    judged = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", shas[5], "--state-dir",
                 str(tmp_path / "state"), "--image", TEMPLATE, "--json", str(tmp_path / "o.json"), "--",
                 "python3", "tests/check.py", env=docker.env)
    assert judged.returncode == 125, judged.stderr
    assert (f"image {expand(TEMPLATE, shas[5])} is not commit {shas[5][:12]}: vLLM 0.9.3.dev0+g{other[:9]} "
            f"names {other[:9]}") in judged.stdout
    assert not scenario_runs(docker)


def test_the_image_digest_is_part_of_the_verdict_cache_key(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    ref = expand(TEMPLATE, shas[12])
    first_digest = docker.add_image(ref, vllm_site(f"0.9.12+g{shas[12][:9]}", True))

    def judge():
        out = tmp_path / "o.json"
        done = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", shas[12], "--state-dir",
                   str(tmp_path / "state"), "--image", TEMPLATE, "--json", str(out), "--reuse-verdicts", "--",
                   "python3", "tests/check.py", env=docker.env)
        assert done.returncode == 1, done.stderr
        return json.loads(out.read_text())

    assert not judge()["cached"]
    again = judge()
    assert again["cached"] and again["details"]["image"]["digest"] == first_digest
    # CI rebuilt the commit's image and this machine pulled it: a new digest is a new question
    second_digest = docker.add_image(ref, vllm_site(f"0.9.12+g{shas[12][:9]}", True), salt="rebuilt", local=True)
    third = judge()
    assert not third["cached"] and third["details"]["image"]["digest"] == second_digest
    listed = cli("cache", "list", "--repo", str(repo.path), "--state-dir", str(tmp_path / "state")).stdout
    assert first_digest in listed and second_digest in listed


def test_only_images_the_tool_pulled_are_pruned_least_recently_used_first(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    publish(docker, shas, range(16), local={0})  # the good end's image was here before: never removed
    run = bisect(cli, repo, shas, tmp_path / "state", docker, "--image-cache-size", "10M",
                 json_file=tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    pulled = [call[1] for call in docker.calls() if call[0] == "pull"]
    removed = [call[2] for call in docker.calls() if call[:2] == ["image", "rm"]]
    assert len(pulled) >= 3 and removed  # each image is 12 MB here: over 10M, older pulls go
    assert expand(TEMPLATE, shas[0]) not in removed and docker.is_local(expand(TEMPLATE, shas[0]))
    assert set(removed) < set(pulled)
    assert removed == pulled[:len(removed)]  # least recently used first
    assert docker.is_local(pulled[-1])


def test_availability_is_kept_in_the_record_and_a_miss_expires(make_repo, docker, tmp_path, monkeypatch):
    repo, shas = history(make_repo, count=4)
    publish(docker, shas, [1])
    docker.activate(monkeypatch)
    settings = ImageSettings(TEMPLATE)
    db = tmp_path / "state.sqlite"
    found = ImageIndex(Runtime.find("docker"), db, settings).resolve(shas)
    assert [found[sha].present for sha in shas] == [False, True, False, False]
    assert found[shas[1]].digest.startswith("sha256:") and found[shas[1]].size == 6_000_000
    asked = [call for call in docker.calls() if call[:2] == ["manifest", "inspect"]]
    assert len(asked) == 4
    docker.clear_calls()
    publish(docker, shas, [2])  # pushed since: the stored miss hides it until it expires
    again = ImageIndex(Runtime.find("docker"), db, settings).resolve(shas)
    assert not again[shas[2]].present and again[shas[1]].present
    assert not [call for call in docker.calls() if call[:2] == ["manifest", "inspect"]]
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE images SET checked = checked - 7200 WHERE present = 0")
    later = ImageIndex(Runtime.find("docker"), db, settings).resolve(shas)
    assert later[shas[2]].present
    assert sorted(call[-1] for call in docker.calls() if call[:2] == ["manifest", "inspect"]) == \
        sorted(expand(TEMPLATE, shas[i]) for i in (0, 2, 3))  # only the misses were asked again


def test_pull_progress_counts_layers_and_bytes_as_the_pull_goes(docker, tmp_path, monkeypatch):
    ref = "rocm/vllm-ci:" + "a" * 40
    docker.add_image(ref, {}, layer_sizes=(3_000_000, 2_000_000, 1_000_000))
    env = {**os.environ, **docker.env, "FAKE_DOCKER_PULL_GATE": str(tmp_path / "gate")}
    docker.activate(monkeypatch)
    info = Runtime.find("docker").remote(ref)
    log = tmp_path / "pull-aaaaaaaaaaaa.log"
    write_pull_layers(log, info)
    with open(log, "w") as out:
        proc = subprocess.Popen([str(docker.bin / "docker"), "pull", ref], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
        while "Download complete" not in log.read_text():  # the first layer is in; the pull waits at the gate
            assert proc.poll() is None
            time.sleep(0.02)
        assert pull_progress(log) == "1/3 layers, 3.0 MB/6.0 MB"
        (tmp_path / "gate").touch()
        assert proc.wait(timeout=60) == 0
    assert pull_progress(log) == "3/3 layers, 6.0 MB/6.0 MB"


@pytest.mark.parametrize("args, message", [
    (["--image", "rocm/vllm-ci:latest"], "--image 'rocm/vllm-ci:latest' names no commit: put {commit}"),
    (["--image", "rocm/vllm-ci:{commit}-{sha}"], "only {commit} and {short} may be filled in"),
    (["--image-fallback", "build"], "--image-fallback needs --image"),
    (["--image", TEMPLATE, "--env", "per-commit"], "--image brings each commit's own environment"),
    (["--image", TEMPLATE, "--aiter", "pinned"], "--image brings each commit's own AITER"),
    (["--aiter-prebuild"], "--aiter-prebuild needs --aiter pinned"),
])
def test_bad_image_options_are_one_line_and_exit_2(make_repo, docker, tmp_path, cli, args, message):
    repo, shas = history(make_repo, count=3)
    before = repo.snapshot()
    run = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"), *args, "--", "python3", "tests/check.py", env=docker.env)
    assert run.returncode == 2
    assert run.stderr.startswith("bisector: error: ") and message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert repo.snapshot() == before and not docker.calls()


def test_image_refused_for_a_scenario_that_judges_the_checkout_here(make_repo, tmp_path, cli, docker):
    repo, shas = history(make_repo, count=3)
    run = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"), "--image", TEMPLATE, "--scenario", "aiter-mla-probe", env=docker.env)
    assert run.returncode == 2 and "scenario aiter-mla-probe cannot run inside an image" in run.stderr


def test_no_container_runtime_is_one_line(make_repo, tmp_path, cli):
    repo, shas = history(make_repo, count=3)
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    for tool in ("git", "python3", "sh"):
        (bare / tool).symlink_to(shutil.which(tool))
    run = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"), "--image", TEMPLATE, "--container-runtime", "podman", "--", "python3",
              "tests/check.py", env={"PATH": str(bare)})
    assert run.returncode == 2
    assert run.stderr.strip() == ("bisector: error: --image needs a container runtime: podman is not on PATH "
                                  "(install it, or give --container-runtime docker)")


def test_doctor_reports_the_container_runtime(docker, cli, tmp_path):
    done = cli("doctor", "--state-dir", str(tmp_path / "state"), env=docker.env)
    line = next(line for line in done.stdout.splitlines() if line.startswith("container runtime: "))
    assert line == (f"container runtime: docker 28.2.2-fake ({docker.bin / 'docker'}), server 28.2.2-fake; GPUs "
                    f"for containers: /dev/dri/renderD128 /dev/dri/renderD136 (agent metadata), render group "
                    f"{RENDER_GID}")


# -- the flags, from one implementation ------------------------------------------------------------------

def test_amd_flags_are_vllm_runners_and_the_ci_launcher_gets_them_from_bisector(docker, project_root):
    assert amd_gpu_flags(["/dev/dri/renderD128", "/dev/dri/renderD136"], RENDER_GID) == AMD_RUNNER_FLAGS
    done = subprocess.run([sys.executable, "-m", "bisector.world.images", "flags"], capture_output=True, text=True,
                          env={**os.environ, **docker.env, "PYTHONPATH": str(project_root)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == AMD_RUNNER_FLAGS


def test_a_slot_gets_only_its_own_render_devices(tmp_path):
    nodes = tmp_path / "nodes"
    for node, (simds, minor) in enumerate([(0, None), (304, 128), (304, 136), (304, 144)]):
        (nodes / str(node)).mkdir(parents=True)
        (nodes / str(node) / "properties").write_text(
            f"simd_count {simds}\n" + (f"drm_render_minor {minor}\n" if minor else ""))
    machine = topology_render_devices(nodes)
    assert machine == ["/dev/dri/renderD128", "/dev/dri/renderD136", "/dev/dri/renderD144"]
    slot = {"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert slot_render_devices(slot, machine) == ["/dev/dri/renderD136", "/dev/dri/renderD144"]
    assert slot_render_devices({}, machine) == machine
    assert inside_gpu_env({**slot, "OTHER": "x"}) == {"OTHER": "x", "HIP_VISIBLE_DEVICES": "0,1",
                                                       "CUDA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(ValueError, match="GPU 3 has no render device"):
        slot_render_devices({"ROCR_VISIBLE_DEVICES": "3"}, machine)


def test_templates():
    assert check_template(TEMPLATE) == TEMPLATE
    assert expand("registry.local/vllm:{short}-rocm", "0123456789abcdef" * 2 + "01234567") == \
        "registry.local/vllm:0123456789ab-rocm"
