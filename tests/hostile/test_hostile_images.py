"""Hostile rows for --image (issue 45 items 9, 10, 14): an image whose proofs contradict each other, two jobs on one
host whose drivers have the same pid (own PID namespaces), a registry that stops sending. Real CLI, real git, real
SQLite, real processes; the container runtime is the stand-in tests/fakes/docker, one "daemon" for every run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.containers import FakeDocker, vllm_site

from bisector.world.images import REVISION_LABEL, ImageInfo, expand, prove

pytestmark = pytest.mark.integration

TEMPLATE = "rocm/vllm-ci:{commit}"
CULPRIT = 9
CHECK = ("import sys, vllm\n"
         "print('vllm', vllm.__version__)\n"
         "sys.exit(1 if vllm.BROKEN else 0)\n")


@pytest.fixture
def docker(tmp_path):
    return FakeDocker(tmp_path / "fake")


def history(make_repo, count: int = 16, name: str = "repo"):
    """count commits whose vllm package is broken from commit CULPRIT on."""
    repo = make_repo(name)
    shas = [repo.commit(f"change {i}", {"tests/check.py": CHECK, "counter.txt": f"{i}\n",
                                        "vllm/__init__.py": f"__version__ = 'src'\nBROKEN = {i >= CULPRIT}\n"})
            for i in range(count)]
    return repo, shas


def publish(docker: FakeDocker, shas: list[str], which, local=True) -> None:
    """Honest images of the commits of `which`: version +g<sha>, revision label the sha."""
    for i in which:
        docker.add_image(expand(TEMPLATE, shas[i]), vllm_site(f"0.9.{i}.dev0+g{shas[i][:9]}", i >= CULPRIT),
                         labels={REVISION_LABEL: shas[i]}, local=local)


def verdicts_of(state: Path, sha: str) -> list[tuple]:
    """The verdicts the record keeps for sha (what a later run would be served)."""
    with sqlite3.connect(state / "bisector.sqlite") as db:
        return db.execute("SELECT verdict, reason FROM executions WHERE sha = ?", (sha,)).fetchall()


def judge_one(cli, repo, sha, state, env, *extra, timeout: float = 300):
    out = state.parent / "one.json"
    done = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--state-dir", str(state),
               "--image", TEMPLATE, "--json", str(out), *extra, "--", "python3", "tests/check.py", env=env,
               timeout=timeout)
    return done, (json.loads(out.read_text()) if out.is_file() else None)


# -- item 9: proofs that contradict each other -----------------------------------------------------------------

def lying(shas, i, version_of, label_of):
    """An image under commit i's tag whose vLLM version names commit version_of and whose label names label_of."""
    return vllm_site(f"0.9.{version_of}.dev0+g{shas[version_of][:9]}", version_of >= CULPRIT), \
        {REVISION_LABEL: shas[label_of]}


@pytest.mark.parametrize("version_of, label_of, named", [
    (12, 5, "vLLM 0.9.12.dev0+g"),      # the label names the commit, the version another
    (5, 12, f"label {REVISION_LABEL}="),  # the version names the commit, the label another
])
def test_an_image_whose_proofs_disagree_is_a_skip_naming_both_never_a_verdict(
        make_repo, docker, tmp_path, cli, version_of, label_of, named):
    repo, shas = history(make_repo)
    site, labels = lying(shas, 5, version_of, label_of)
    docker.add_image(expand(TEMPLATE, shas[5]), site, labels=labels, local=True)
    state = tmp_path / "state"
    done, outcome = judge_one(cli, repo, shas[5], state, docker.env)
    assert done.returncode == 125, (done.stdout, done.stderr)
    assert outcome["verdict"] == "skip"
    other = shas[12][:9]  # a version names a commit by 9 hex
    assert f"{named}" in outcome["reason"] and other in outcome["reason"] and shas[5][:12] in outcome["reason"]
    assert not [argv for argv in docker.runs() if "tests/check.py" in argv]  # nothing ran in that image
    assert verdicts_of(state, shas[5]) == []  # about the image, not the commit: never served again


def test_a_hunt_through_a_mislabelled_image_names_no_wrong_culprit(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo)
    publish(docker, shas, [i for i in range(16) if i != CULPRIT - 1])
    # the commit before the culprit: labelled as itself, but it holds a later (broken) commit's vLLM
    site, labels = lying(shas, CULPRIT - 1, 12, CULPRIT - 1)
    docker.add_image(expand(TEMPLATE, shas[CULPRIT - 1]), site, labels=labels, local=True)
    out = tmp_path / "r.json"
    done = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / "state"), "--image", TEMPLATE, "--json", str(out), "--", "python3", "tests/check.py",
               env=docker.env)
    result = json.loads(out.read_text())
    assert (done.returncode, result["culprit"]) == (1, None), (done.stdout, done.stderr)  # not shas[8], exit 0
    assert set(result["candidates"]) == {shas[CULPRIT - 1], shas[CULPRIT]}
    (step,) = [s for s in result["steps"] if s["sha"] == shas[CULPRIT - 1]]
    assert step["verdict"] == "skip" and shas[12][:9] in step["reason"]
    assert verdicts_of(tmp_path / "state", shas[CULPRIT - 1]) == []


@pytest.mark.parametrize("label, version, checkout, ok", [
    ("A", None, "B", False),   # label and checkout disagree
    (None, "A", "B", False),   # version and checkout disagree
    ("A", "A", "B", False),    # two proofs for, one against: still a contradiction
    ("A", "A", "A", True),     # all agree
    (None, None, "A", True),   # one proof alone
    ("B", None, None, False),  # the one proof names another commit
])
def test_prove_needs_every_proof_to_name_the_commit(label, version, checkout, ok):
    commits = {"A": "a" * 40, "B": "b" * 40}
    info = ImageInfo("rocm/vllm-ci:x", True, True, labels={REVISION_LABEL: commits[label]} if label else {})
    found = {"vllm": f"0.9.0+g{commits[version][:9]}" if version else "0.9.0",
             "checkouts": {"/vllm-workspace": commits[checkout]} if checkout else {}}
    proof = prove(commits["A"], info, found)
    assert proof.ok is ok, proof.reason
    if not ok:
        assert "b" * 12 in proof.reason and "a" * 12 in proof.reason


# -- item 10: two jobs on one host, the same driver pid ----------------------------------------------------------

def unshare_pid() -> list[str]:
    """The prefix that runs a command as pid 1 of a PID namespace of its own, or skip where that is not allowed."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("needs unshare --pid (root, or user namespaces)")
    return [unshare, "--pid", "--fork", "--mount-proc"]


def test_two_jobs_whose_drivers_share_a_pid_never_touch_each_others_containers(
        make_repo, docker, tmp_path, project_root, git_env, wait_for):
    prefix = unshare_pid()
    gate = tmp_path / "gate"
    jobs = {}
    for job in ("a", "b"):
        repo, shas = history(make_repo, count=2, name=f"repo-{job}")
        publish(docker, shas, [0])
        started = tmp_path / f"started-{job}"
        script = (f"import os, sys, time, vllm\nopen({str(started)!r}, 'w').close()\n"
                  f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.05)\n"
                  f"sys.exit(1 if vllm.BROKEN else 0)\n")
        env = {**os.environ, **git_env, "PYTHONPATH": str(project_root), **docker.env}
        argv = [*prefix, sys.executable, "-m", "bisector.cli", "scenario", "run", "command", "--repo",
                str(repo.path), "--ref", shas[0], "--state-dir", str(tmp_path / f"state-{job}"), "--image", TEMPLATE,
                "--", "python3", "-c", script]
        proc = jobs[job] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # one job's step is in its container before the other starts its own
        assert wait_for(lambda started=started, proc=proc: started.exists() or proc.poll() is not None), job
        assert started.exists(), proc.communicate()
    gate.touch()
    ends = {job: proc.communicate(timeout=300) for job, proc in jobs.items()}
    for job, proc in jobs.items():
        assert proc.returncode == 0, (job, ends[job])  # good, as its commit is: not killed by the other job
    names = [argv[argv.index("--name") + 1] for argv in docker.runs() if "--name" in argv]
    assert len(names) == 2 and len(set(names)) == 2, names
    assert not any((docker.home / "containers").iterdir())  # each removed its own, and only its own


# -- item 14: a registry that stops sending ----------------------------------------------------------------------

def stalled(docker: FakeDocker, command: str) -> list[int]:
    """The pids of the stand-in's commands that stalled (and may still be stalled)."""
    folder = docker.home / "stalled"
    return [int(path.read_text()) for path in folder.glob(f"{command}.*")] if folder.is_dir() else []


def test_a_stalled_pull_is_given_up_as_a_skip_not_stored_and_a_later_pull_judges_the_commit(
        make_repo, docker, tmp_path, cli, pid_alive):
    repo, shas = history(make_repo, count=2)
    publish(docker, shas, [0], local=False)
    state = tmp_path / "state"
    stalling = {**docker.env, "FAKE_DOCKER_STALL": "pull", "BISECTOR_IMAGE_STALL_SECONDS": "2"}
    done, outcome = judge_one(cli, repo, shas[0], state, stalling, "--timeout", "5", timeout=120)
    assert done.returncode == 125, (done.stdout, done.stderr)
    assert outcome["reason"].startswith(f"pull of {expand(TEMPLATE, shas[0])} stalled: no output for 2 s")
    (pid,) = stalled(docker, "pull")
    assert not pid_alive(pid)  # the stalled pull was killed, not left running
    assert verdicts_of(state, shas[0]) == []
    again, outcome = judge_one(cli, repo, shas[0], state, docker.env)
    assert again.returncode == 0 and outcome["verdict"] == "good" and not outcome["cached"], again.stderr


def test_a_stalled_registry_answer_is_bounded_and_a_skip_naming_it(make_repo, docker, tmp_path, cli):
    repo, shas = history(make_repo, count=2)
    publish(docker, shas, [0], local=False)
    stalling = {**docker.env, "FAKE_DOCKER_STALL": "manifest", "BISECTOR_IMAGE_STALL_SECONDS": "2"}
    done, outcome = judge_one(cli, repo, shas[0], tmp_path / "state", stalling, timeout=60)
    assert done.returncode == 125, (done.stdout, done.stderr)
    assert outcome["reason"] == (f"image {expand(TEMPLATE, shas[0])} unknown: docker manifest inspect gave no "
                                 f"answer in 2 s (the registry stalls)")


@pytest.mark.parametrize("command", ["pull", "manifest"])
def test_sigterm_ends_a_run_stalled_on_the_registry_at_once(make_repo, docker, tmp_path, project_root, git_env,
                                                            wait_for, pid_alive, command):
    repo, shas = history(make_repo, count=2)
    publish(docker, shas, [0], local=False)
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root), **docker.env, "FAKE_DOCKER_STALL": command}
    proc = subprocess.Popen([sys.executable, "-m", "bisector.cli", "scenario", "run", "command", "--repo",
                             str(repo.path), "--ref", shas[0], "--state-dir", str(tmp_path / "state"), "--image",
                             TEMPLATE, "--", "python3", "tests/check.py"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: stalled(docker, command) or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)  # a stalled call's own bound is 120 s or more: not waited out
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"SIGTERM did not end the run stalled in `docker {command}`") from None
    assert proc.returncode == 130, err
    assert wait_for(lambda: not any(pid_alive(pid) for pid in stalled(docker, command)))


def test_sigterm_during_a_step_removes_its_container(make_repo, docker, tmp_path, project_root, git_env, wait_for,
                                                     pid_alive):
    repo, shas = history(make_repo, count=2)
    publish(docker, shas, [0])
    mark = tmp_path / "container-pid"
    script = f"import os, signal\nopen({str(mark)!r}, 'w').write(str(os.getpid()))\nsignal.pause()\n"
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root), **docker.env}
    proc = subprocess.Popen([sys.executable, "-m", "bisector.cli", "scenario", "run", "command", "--repo",
                             str(repo.path), "--ref", shas[0], "--state-dir", str(tmp_path / "state"), "--image",
                             TEMPLATE, "--", "python3", "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: mark.is_file() and mark.read_text() or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert not pid_alive(int(mark.read_text()))  # the container was removed as the driver stopped
    assert not any((docker.home / "containers").iterdir())
