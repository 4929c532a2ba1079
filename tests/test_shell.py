"""`bisector shell` (issue 34 item 8): a tool-owned worktree of one commit, built as a step builds it, running a
command (or the user's shell) in the step's environment, and nothing left behind."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

SETUP = '''\
from setuptools import Extension, setup

setup(name="fixturepkg", version="0", packages=["fixturepkg"],
      ext_modules=[Extension("fixturepkg._C", ["csrc/native.c"])])
'''
NATIVE_C = '''\
#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_C", 0, -1, 0};
PyMODINIT_FUNC PyInit__C(void) {
    PyObject *mod = PyModule_Create(&m);
    PyModule_AddIntConstant(mod, "NATIVE_VERSION", %d);
    return mod;
}
'''
# What the command shows of the tree it runs in: its commit, the extension the build made, the python on PATH.
SHOW = "git rev-parse HEAD; ls fixturepkg/*.so; python -c 'import fixturepkg._C as c, sys; " \
       "print(c.NATIVE_VERSION, sys.executable)'"


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> str:
    """A throwaway environment for `setup.py develop` (it registers the package there)."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True)
    return str(path / "bin" / "python")


def native_repo(make_repo) -> tuple:
    """Two commits of a vLLM-shaped tree whose build compiles a C extension (its NATIVE_VERSION: 1, then 2)."""
    repo = make_repo()
    shas = [repo.commit(f"native {n}", {"setup.py": SETUP, "csrc/native.c": NATIVE_C % n, "fixturepkg/__init__.py": "",
                                        "vllm/__init__.py": "", "requirements/build/rocm.txt": "setuptools\n",
                                        ".gitignore": "build/\n*.so\n*.egg-info/\n"})
            for n in (1, 2)]
    return repo, shas


def left_behind(repo, state) -> dict:
    """What a shell must not leave: worktrees, branches, the state dir's shells."""
    shells = state / "shells"
    return {"worktrees": repo.git("worktree", "list", "--porcelain").count("worktree "),
            "branches": repo.git("branch", "--list"), "shells": sorted(shells.iterdir()) if shells.exists() else []}


@pytest.mark.slow
def test_command_runs_in_the_built_tree_at_the_commit_and_nothing_is_left(make_repo, tmp_path, cli, venv_python):
    repo, shas = native_repo(make_repo)
    state = tmp_path / "state"
    before = repo.snapshot()
    proc = cli("shell", "--ref", shas[0], "--repo", str(repo.path), "--state-dir", str(state), "--python",
               venv_python, "--build", "auto", "--allow-install-into-python", "--", "sh", "-c", SHOW + "; exit 7",
               env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 7, proc.stderr  # the command's own exit code
    head, extension, loaded = proc.stdout.splitlines()
    assert head == shas[0]
    assert extension.startswith("fixturepkg/_C") and extension.endswith(".so")
    assert loaded == f"1 {venv_python}"  # this commit's extension, in --python (first on PATH)
    assert f"bisector: {shas[0][:12]} in {state.resolve()}/shells/" in proc.stderr
    assert repo.snapshot() == before
    assert left_behind(repo, state) == {"worktrees": 1, "branches": "* main", "shells": []}


def test_keep_keeps_the_worktree_and_prints_its_path(make_repo, tmp_path, cli):
    repo = make_repo()
    first = repo.commit("one", {"a.txt": "1\n"})
    repo.commit("two", {"a.txt": "2\n"})
    state = tmp_path / "state"
    proc = cli("shell", "--ref", "HEAD~1", "--repo", str(repo.path), "--state-dir", str(state), "--keep", "--",
               "cat", "a.txt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1\n"
    [kept] = [line for line in proc.stderr.splitlines() if line.startswith("kept worktree: ")]
    path = kept.removeprefix("kept worktree: ").split(" (remove it")[0]
    assert repo.git("-C", path, "rev-parse", "HEAD") == first
    assert path in repo.git("worktree", "list")
    # the user's shell when no command is given: $SHELL, reading the commands from stdin here
    interactive = subprocess.run([sys.executable, "-m", "bisector.cli", "shell", "--ref", first, "--repo",
                                  str(repo.path), "--state-dir", str(state)], input="cat a.txt; exit 3\n",
                                 capture_output=True, text=True, timeout=120, cwd=repo.path,
                                 env={**cli_env(), "SHELL": "/bin/sh"})
    assert interactive.returncode == 3 and interactive.stdout == "1\n", interactive.stderr
    assert left_behind(repo, state)["worktrees"] == 2  # the kept one only


def cli_env() -> dict:
    import os
    from pathlib import Path

    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def test_a_bad_ref_is_one_line_and_leaves_the_repository_as_it_was(make_repo, cli):
    repo = make_repo()
    repo.commit("one", {"a.txt": "1\n"})
    before = repo.snapshot()
    proc = cli("shell", "--ref", "no-such-ref", "--repo", str(repo.path), "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("bisector: error: ") and \
        "no-such-ref" in proc.stderr, proc.stderr
    assert repo.snapshot() == before
    assert not (repo.path / ".git" / "bisector").exists() and not (repo.path / ".git" / "bisector.lock").exists()


@pytest.mark.slow
def test_a_failed_build_is_one_line_and_the_worktree_is_removed(make_repo, tmp_path, cli, venv_python):
    repo, shas = native_repo(make_repo)
    broken = repo.commit("broken native", {"csrc/native.c": "syntax error here\n"})
    state = tmp_path / "state"
    before = repo.snapshot()
    proc = cli("shell", "--ref", broken, "--repo", str(repo.path), "--state-dir", str(state), "--python",
               venv_python, "--build", "auto", "--allow-install-into-python", "--", "touch", str(tmp_path / "ran"),
               env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"bisector: error: {broken[:12]}: build failed: ") and "(log: " in line
    assert not (tmp_path / "ran").exists()
    assert repo.snapshot() == before
    assert left_behind(repo, state) == {"worktrees": 1, "branches": "* main", "shells": []}


def test_image_runs_the_command_in_the_commits_container_with_the_worktree_mounted(make_repo, tmp_path, cli):
    from fakes.containers import FakeDocker, vllm_site

    from bisector.world.images import expand

    docker = FakeDocker(tmp_path / "fake")
    repo = make_repo()
    check = "import vllm\nprint('vllm from', vllm.__file__, vllm.__version__)\n"
    sha = repo.commit("one", {"tools/check.py": check, "vllm/__init__.py": "__version__ = 'src'\n"})
    template = "rocm/vllm-ci:{commit}"
    docker.add_image(expand(template, sha), vllm_site(f"0.9.1.dev0+g{sha[:9]}", False),
                     labels={"org.opencontainers.image.revision": sha})
    state = tmp_path / "state"
    proc = cli("shell", "--ref", sha, "--repo", str(repo.path), "--state-dir", str(state), "--image", template,
               "--", "python3", "tools/check.py", env=docker.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"vllm from {docker.home / 'sites'}")  # the image's vLLM, not the checkout's
    [run] = [argv for argv in docker.runs() if "tools/check.py" in argv]
    worktree = run[run.index("-w") + 1]
    assert worktree.startswith(f"{state.resolve()}/shells/") and f"{worktree}:{worktree}" in run
    assert run[run.index("--entrypoint") + 1] == "python3" and run[-1] == "tools/check.py"
    assert left_behind(repo, state) == {"worktrees": 1, "branches": "* main", "shells": []}
    assert not any((docker.home / "containers").iterdir())


def test_the_command_sees_the_gpu_variables_a_slot_gets(make_repo, tmp_path, cli):
    repo = make_repo()
    repo.commit("one", {"a.txt": "1\n"})
    proc = cli("shell", "--ref", "HEAD", "--repo", str(repo.path), "--state-dir", str(tmp_path / "state"), "--",
               "sh", "-c", "echo $ROCR_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES $CUDA_VISIBLE_DEVICES",
               env={"ROCR_VISIBLE_DEVICES": "2,5", "HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "5 0 0\n"  # bisector.machine.gpus: HIP indexes within ROCR; the step's physical ids, from 0
