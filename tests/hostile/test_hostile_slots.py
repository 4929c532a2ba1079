"""Hostile rows for the checkouts steps and shells run in (issue 45 items 3, 15, 19, 21; round three item 11): a
step's `git push` to the repository under test (by any spelling of its path), signals to a shell or a run while
its command runs, `--isolate` on shallow and partial clones, and `shell -- CMD`'s default build. Each runs the
real CLI on real repositories and processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def start_cli(project_root: Path, git_env: dict, *args: str, env: dict | None = None) -> subprocess.Popen:
    """The real CLI started (not waited for), its output to pipes."""
    return subprocess.Popen([sys.executable, "-m", "bisector.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, **git_env, "PYTHONPATH": str(project_root), **(env or {})})


# A step (or shell command) that starts a background child, records both pids (each file written whole) and waits.
WITH_A_CHILD = "sleep 600 & echo $! > {dir}/child.tmp; mv {dir}/child.tmp {dir}/child; " \
               "echo $$ > {dir}/leader.tmp; mv {dir}/leader.tmp {dir}/leader; wait"


def pids(folder: Path) -> list[int]:
    return [int((folder / name).read_text()) for name in ("leader", "child")]


# --- item 3: a step's push to the repository under test -------------------------------------------------------

def pushing_step(tmp_path: Path, repo: Path) -> str:
    """A step that pushes its HEAD to the repository under test every way it can name it (through `origin`, a
    remote it adds, a file:// URL), makes a branch of its own, then judges by the `state` file."""
    return script(tmp_path / "push.sh", f"""\
        n=$(cat counter.txt)
        git push -q origin "HEAD:refs/heads/pushed-to-origin-$n" 2>/dev/null
        git remote add u {repo} && git push -q u "HEAD:refs/heads/pushed-by-step-$n" 2>/dev/null
        git push -q "file://{repo}" "HEAD:refs/heads/pushed-by-url-$n" 2>/dev/null
        git checkout -q -b "step-$n"
        grep -q good state
        """)


def test_isolate_refuses_a_steps_push_to_the_repository(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--isolate",
               "--state-dir", str(tmp_path / "state"), "--", pushing_step(tmp_path, repo.path))
    assert proc.returncode == 0, proc.stderr
    assert shas[5] in proc.stdout
    assert repo.snapshot() == before  # no pushed-by-step-N ref, nor any other


@pytest.mark.parametrize("spelling", [
    "{tmp}/elsewhere/../repo", "{tmp}/./repo", "/{repo}", "{tmp}/link", "file://localhost{repo}", "file:///{repo}",
    "$(realpath --relative-to=. {repo})",
], ids=["dot-dot", "dot", "double slash", "a symlink", "file://localhost", "file:////", "relative"])
def test_isolate_refuses_a_steps_push_to_any_spelling_of_the_repository(make_repo, tmp_path, cli, spelling):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(repo.path)
    before = repo.snapshot()
    url = spelling.format(tmp=tmp_path, repo=repo.path)
    step = script(tmp_path / "push.sh", f'git push -q "{url}" HEAD:refs/heads/pushed-by-step; grep -q good state\n')
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--isolate",
               "--no-verify-endpoints", "--state-dir", str(tmp_path / "state"), "--", step)
    assert proc.returncode == 0, proc.stderr
    assert repo.snapshot() == before  # no pushed-by-step ref


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A small local Ray cluster for this module (its workers keep their clones in a temp cache)."""
    ray = pytest.importorskip("ray")
    from bisector.engine.executor import ray_runtime_env

    cache = tmp_path_factory.mktemp("node-cache")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=ray_runtime_env())
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    if saved is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("isolate", [[], ["--isolate"]], ids=["node-clone", "isolate"])
def test_a_ray_step_push_never_reaches_the_repository(cluster, make_repo, tmp_path, cli, git, isolate):
    address = cluster
    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--executor", "ray",
               "--ray-address", address, "--jobs", "2", *isolate, "--state-dir", str(tmp_path / "state"),
               "--", pushing_step(tmp_path, repo.path))
    assert proc.returncode == 0, proc.stderr
    assert shas[5] in proc.stdout
    assert repo.snapshot() == before
    from bisector.engine.executor import node_cache_dir
    from bisector.repo.worktrees import NodeCheckout

    node_clone = NodeCheckout(str(repo.path.resolve()), node_cache_dir(), shas[0], tmp_path).clone_path
    branches = git(node_clone, "branch", "--list")
    if isolate:  # each step in a clone of its own: its branch stays out of the node's clone too
        assert "step-" not in branches, branches
    else:
        assert "step-" in branches, branches  # (where the steps ran: the node's clone)


# --- item 15: SIGHUP and SIGTERM while the command runs ---------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
@pytest.mark.parametrize("image", [False, True], ids=["host", "image"])
def test_a_signalled_shell_ends_its_command_group_and_leaves_no_worktree(make_repo, tmp_path, project_root, git_env,
                                                                         wait_for, pid_alive, signum, image):
    from fakes.containers import FakeDocker, vllm_site

    from bisector.world.images import expand

    repo = make_repo()
    sha = repo.commit("one", {"a.txt": "1\n", "vllm/__init__.py": ""})
    before = repo.git("worktree", "list", "--porcelain")
    state = tmp_path / "state"
    given, env = [], {}
    if image:
        docker = FakeDocker(tmp_path / "fake")
        docker.add_image(expand("rocm/vllm-ci:{commit}", sha), vllm_site(f"0.9.1.dev0+g{sha[:9]}", False),
                         labels={"org.opencontainers.image.revision": sha})
        given, env = ["--image", "rocm/vllm-ci:{commit}"], docker.env
    proc = start_cli(project_root, git_env, "shell", "--ref", sha, "--repo", str(repo.path), "--state-dir", str(state),
                     *given, "--", "sh", "-c", WITH_A_CHILD.format(dir=tmp_path), env=env)
    try:
        assert wait_for(lambda: (tmp_path / "child").exists() and (tmp_path / "leader").exists()), proc.stderr
        os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert wait_for(lambda: not any(pid_alive(pid) for pid in pids(tmp_path))), pids(tmp_path)
    assert repo.git("worktree", "list", "--porcelain") == before
    assert not (state / "shells").exists() or not list((state / "shells").iterdir())
    if image:
        assert not list((docker.home / "containers").iterdir())  # the container removed


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_signalled_run_stops_its_steps_and_leaves_no_slot(make_repo, tmp_path, project_root, git_env, wait_for,
                                                            pid_alive, signum):
    repo = make_repo()
    shas = repo.linear(6, bad_from=3)
    before = repo.snapshot()
    step = script(tmp_path / "step.sh", WITH_A_CHILD.format(dir=tmp_path) + "\n")
    proc = start_cli(project_root, git_env, "run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                     "--jobs", "1", "--no-verify-endpoints", "--state-dir", str(tmp_path / "state"), "--", step)
    try:
        assert wait_for(lambda: (tmp_path / "child").exists() and (tmp_path / "leader").exists()), proc.stderr
        os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert wait_for(lambda: not any(pid_alive(pid) for pid in pids(tmp_path))), pids(tmp_path)
    assert repo.snapshot() == before  # no slot left registered
    assert not list((tmp_path / "state" / "worktrees").iterdir())


# --- item 19: --isolate on shallow and partial clones -----------------------------------------------------------

def clone_of(repo, tmp_path: Path, git, how: str) -> Path:
    """A clone of repo made as users make them: shallow (--depth) or partial (blob-less, from a file:// URL)."""
    git(repo.path, "config", "uploadpack.allowFilter", "true")
    clone = tmp_path / f"{how}-clone"
    depth = ["--depth", "4"] if how == "shallow" else ["--filter=blob:none"]
    subprocess.run(["git", "clone", "-q", *depth, f"file://{repo.path}", str(clone)], check=True, capture_output=True)
    return clone


def repository_state(git, path: Path) -> list[str]:
    return [git(path, *args) for args in (["rev-parse", "HEAD"], ["for-each-ref"], ["worktree", "list", "--porcelain"],
                                          ["status", "--porcelain", "--untracked-files=all"], ["stash", "list"])]


@pytest.mark.parametrize("how", ["shallow", "partial"])
def test_isolate_works_on_shallow_and_partial_clones_and_leaves_no_slot(make_repo, tmp_path, cli, git, how):
    repo = make_repo()
    shas = repo.linear(8, bad_from=6)
    clone = clone_of(repo, tmp_path, git, how)
    before = repository_state(git, clone)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(clone), "--good", shas[4], "--bad", shas[-1], "--isolate", "--state-dir",
               str(state), "--", "sh", "-c", "git log --oneline -1 >/dev/null && grep -q good state")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert shas[6] in proc.stdout
    assert repository_state(git, clone) == before
    assert not list((state / "worktrees").iterdir())


def test_isolate_on_a_partial_clone_whose_remote_is_gone_skips_and_leaves_no_slot(make_repo, tmp_path, cli, git,
                                                                                  state_is_good):
    import shutil

    repo = make_repo()
    shas = repo.linear(8, bad_from=6)
    clone = clone_of(repo, tmp_path, git, "partial")
    shutil.rmtree(repo.path)  # its promisor remote: the objects of older commits cannot be fetched
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(clone), "--good", shas[2], "--bad", shas[-1], "--isolate", "--state-dir",
               str(state), "--", *state_is_good)
    assert proc.returncode == 3, proc.stderr  # the good end cannot be checked out: no verdict
    assert "Traceback" not in proc.stderr
    assert "partial clone" in proc.stdout + proc.stderr
    assert not list((state / "worktrees").iterdir())


# --- item 21: shell -- CMD builds nothing unless asked -----------------------------------------------------------

@pytest.fixture(scope="module")
def throwaway_python(tmp_path_factory) -> str:
    """An environment of the test's own (a refused build would otherwise name the test's interpreter)."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(path)], check=True)
    return str(path / "bin" / "python")


def buildable_repo(make_repo):
    """A vLLM-shaped commit whose build would install its requirements (refused in --python by default)."""
    repo = make_repo()
    repo.commit("one", {"a.txt": "1\n", "vllm/__init__.py": "", "requirements/build/rocm.txt": "setuptools\n",
                        "setup.py": "from setuptools import setup\nsetup(name='fixture')\n"})
    return repo


def test_shell_with_a_command_builds_nothing_by_default(make_repo, tmp_path, cli, throwaway_python):
    repo = buildable_repo(make_repo)
    state = tmp_path / "state"
    proc = cli("shell", "--ref", "HEAD", "--repo", str(repo.path), "--state-dir", str(state), "--python",
               throwaway_python, "--", "cat", "a.txt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1\n"
    assert "(none" in proc.stderr  # the build it did: none


def test_a_refused_build_names_the_options_and_keep_keeps_nothing(make_repo, tmp_path, cli, throwaway_python,
                                                                  hostile):
    repo = buildable_repo(make_repo)
    before = repo.snapshot()
    state = tmp_path / "state"
    proc = cli("shell", "--ref", "HEAD", "--repo", str(repo.path), "--state-dir", str(state), "--python",
               throwaway_python, "--build", "source", "--keep", "--", "touch", str(tmp_path / "ran"))
    line = hostile.one_line_error(proc, 1)
    assert "build refused" in line and "--allow-install-into-python" in line and "--build none" in line, line
    assert not (tmp_path / "ran").exists()
    assert repo.snapshot() == before  # the failed set-up's worktree is not kept
    assert not (state / "shells").exists() or not list((state / "shells").iterdir())
