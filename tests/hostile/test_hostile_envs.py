"""Hostile rows for the environments, caches and config paths the user named (issue 45 items 1, 2 and 4):
the tool changes nothing of theirs — an editable vLLM in the user's --python, a folder of their own under
$BISECTOR_CACHE_DIR — and a `~` or a relative path in a config file means what it means in a shell."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

# vLLM's precompiled path in miniature: with VLLM_USE_PRECOMPILED, setup.py extracts the wheel's compiled
# files into the tree before setup() runs (vLLM's extract_precompiled_and_patch_package).
PRECOMPILED_SETUP = '''\
import os, zipfile
if os.environ.get("VLLM_USE_PRECOMPILED") == "1":
    zipfile.ZipFile(os.environ["VLLM_PRECOMPILED_WHEEL_LOCATION"]).extract("vllm/_C.abi3.so")
from setuptools import setup
setup(name="vllm", version="0", packages=["vllm"])
'''
# The step: the commit's own vllm (not the user's), with the wheel's compiled file beside it.
SEES_THE_COMMIT = ("import pathlib, sys, vllm; sys.exit(0 if vllm.WHERE == 'commit' and "
                   "(pathlib.Path(vllm.__file__).parent / '_C.abi3.so').is_file() else 1)")
WHERE_IS_VLLM = "import vllm; print(vllm.WHERE, vllm.__file__)"


def _python(python: Path, *args: str, cwd: Path | None = None) -> str:
    return subprocess.run([str(python), *args], check=True, capture_output=True, text=True, cwd=cwd).stdout


def _editable_egg_link(python: Path, tree: Path, tmp_path: Path) -> None:
    """setuptools' legacy editable install: vllm.egg-link and a line in easy-install.pth."""
    _python(python, "setup.py", "develop", "--no-deps", cwd=tree)


def _editable_pep660(python: Path, tree: Path, tmp_path: Path) -> None:
    """A PEP 660 editable wheel (setuptools' build_editable: an __editable__ .pth) installed by pip."""
    dist = tmp_path / "editable-dist"
    build = f"from setuptools import build_meta; build_meta.build_editable({str(dist)!r})"
    subprocess.run([sys.executable, "-c", build], check=True, capture_output=True, cwd=tree)
    wheel = next(dist.glob("*.whl"))
    _python(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel))


@pytest.mark.parametrize("build, editable", [("precompiled", _editable_egg_link), ("auto", _editable_egg_link),
                                             ("precompiled", _editable_pep660)],
                         ids=["precompiled-egg-link", "auto-egg-link", "precompiled-pep660"])
def test_a_build_in_the_users_python_leaves_their_editable_vllm_as_it_was(build, editable, make_repo, tmp_path,
                                                                           cli, hostile):
    """Item 1: the build ran `setup.py develop` in --python, re-pointing the user's editable vllm at the slot
    worktree; once the slot was removed the user's environment imported no vLLM at all."""
    tree = tmp_path / "users-vllm"
    (tree / "vllm").mkdir(parents=True)
    (tree / "setup.py").write_text("from setuptools import setup\nsetup(name='vllm', version='0.0.1', "
                                   "packages=['vllm'])\n")
    (tree / "vllm" / "__init__.py").write_text("WHERE = 'user'\n")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "user-venv")], check=True)
    python = tmp_path / "user-venv" / "bin" / "python"
    editable(python, tree, tmp_path)
    purelib = Path(_python(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    freeze = _python(python, "-m", "pip", "freeze", "--all")
    site, users = hostile.tree_listing(purelib), hostile.tree_listing(tree)
    assert _python(python, "-c", WHERE_IS_VLLM, cwd=tmp_path).startswith("user ")

    repo = make_repo()
    sha = repo.commit("a vLLM-shaped tree", {"setup.py": PRECOMPILED_SETUP, "vllm/__init__.py": "WHERE = 'commit'\n",
                                             ".gitignore": "build/\n*.egg-info/\nvllm/*.so\n"})
    wheels = tmp_path / "wheels" / sha
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "vllm-0-cp38-abi3-linux_x86_64.whl", "w") as wheel:
        wheel.writestr("vllm/_C.abi3.so", "compiled")
    before = repo.snapshot()
    proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--build", build, "--wheels",
               str(tmp_path / "wheels"), "--python", str(python), "--state-dir", str(tmp_path / "state"),
               "--", str(python), "-c", SEES_THE_COMMIT, env={"PIP_NO_INDEX": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the commit's build served its step
    assert list((tmp_path / "state").rglob("build-*-develop-precompiled.log")), "the wheel's build did not run"
    assert hostile.tree_listing(purelib) == site  # no egg-link, .pth line or __editable__ file added or changed
    assert _python(python, "-m", "pip", "freeze", "--all") == freeze
    assert hostile.tree_listing(tree) == users
    assert _python(python, "-c", WHERE_IS_VLLM, cwd=tmp_path).split() == ["user", str(tree / "vllm" / "__init__.py")]
    assert repo.snapshot() == before


def _users_disk(tmp_path: Path) -> Path:
    """A user's big disk named as the cache root, already holding their own models/ and compile/ folders."""
    disk = tmp_path / "big-disk"
    (disk / "models" / "llama").mkdir(parents=True)
    (disk / "models" / "llama" / "model.safetensors").write_bytes(b"weights" * 1000)
    (disk / "compile").mkdir()
    (disk / "compile" / "notes.txt").write_text("my own build notes\n")
    return disk


def _forget(cli, repo, disk: Path):
    return cli("cache", "forget", "--compile", "--repo", str(repo.path), env={"BISECTOR_CACHE_DIR": str(disk)})


def _list(cli, repo, disk: Path):
    return cli("cache", "list", "--repo", str(repo.path), env={"BISECTOR_CACHE_DIR": str(disk)})


def _step(cli, repo, disk: Path):
    """A GPU step's hold on the root (trimmed to a cap of 0 first), as the dpa-fp8-kv scenario takes it."""
    from bisector.errors import UsageError
    from bisector.machine.compile_cache import in_use
    with pytest.raises(UsageError) as refused:
        with in_use(disk, 0):
            pass
    return subprocess.CompletedProcess([], 2, "", f"bisector: error: {refused.value}\n")


@pytest.mark.parametrize("command", [_forget, _step], ids=["cache-forget-compile", "a-step-trimming-to-its-cap"])
def test_a_cache_root_holding_the_users_files_is_refused_in_one_line(command, make_repo, tmp_path, cli, hostile):
    """Item 2: `cache forget --compile` deleted the user's models/ and compile/ wholesale; a step's trim to the
    cap would have removed them too."""
    disk = _users_disk(tmp_path)
    before = hostile.tree_listing(disk)
    repo = make_repo()
    repo.commit("one", {"a": "1"})
    line = hostile.one_line_error(command(cli, repo, disk))
    assert f"cache dir {disk} holds files bisector did not make (no bisector-cache marker)" in line, line
    assert "$BISECTOR_CACHE_DIR" in line, line
    assert hostile.tree_listing(disk) == before and sorted(p.name for p in disk.iterdir()) == ["compile", "models"]


def test_cache_list_counts_none_of_the_users_files(make_repo, tmp_path, cli, hostile):
    """Item 2: `cache list` counted the user's files as the cache's (their weights as a model dir)."""
    disk = _users_disk(tmp_path)
    before = hostile.tree_listing(disk)
    repo = make_repo()
    sha = repo.commit("one", {"a": "1"})
    judged = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--", "true")
    assert judged.returncode == 0, judged.stderr  # a record with one cached verdict
    proc = _list(cli, repo, disk)
    assert proc.returncode == 0, proc.stderr
    compile_line = proc.stderr.strip().splitlines()[-1]
    assert compile_line.startswith(f"compile cache: {disk} is not bisector's"), proc.stderr
    assert "nothing counted" in compile_line and "model dirs" not in compile_line, proc.stderr
    assert hostile.tree_listing(disk) == before


def test_forget_compile_in_the_tools_own_root_removes_only_what_the_tool_wrote(make_repo, tmp_path, cli, hostile):
    """Item 2: in a root the tool made (marked), the caches and model dirs go; a file the user put beside them
    stays."""
    from bisector.machine.compile_cache import in_use, publish
    root = tmp_path / "cache-root"
    with in_use(root, 1 << 30):  # a step made the root and wrote into it
        publish(root, "0123456789abcdef", lambda tmp: (tmp / "config.json").write_text("{}"))
        (root / "compile" / "vllm" / "torch_compile_cache").mkdir(parents=True)
        (root / "compile" / "vllm" / "torch_compile_cache" / "entry").write_text("compiled")
    (root / "compile" / "notes.txt").write_text("the user's, put here later\n")
    repo = make_repo()
    repo.commit("one", {"a": "1"})
    proc = _forget(cli, repo, root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("deleted 2 compile cache entries and model dirs"), proc.stdout
    assert not (root / "models").exists() and not (root / "compile" / "vllm").exists()
    assert (root / "compile" / "notes.txt").read_text() == "the user's, put here later\n"


def _configure(place: str, tmp_path: Path, repo, key: str, value: str) -> dict:
    """key = value set in one place: the user's config.toml, [tool.bisector] of the repository's pyproject.toml
    (committed: the work tree stays clean) or BISECTOR_<KEY>; the environment commands then run with."""
    home, config_home = tmp_path / "home", tmp_path / "config-home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(config_home)}
    if place == "config.toml":
        (config_home / "bisector").mkdir(parents=True)
        (config_home / "bisector" / "config.toml").write_text(f'{key} = "{value}"\n')
    elif place == "pyproject.toml":
        repo.commit("config", {"pyproject.toml": f'[tool.bisector]\n{key} = "{value}"\n'})
    else:
        env[f"BISECTOR_{key.upper()}"] = value
    return env


PLACES = ["config.toml", "pyproject.toml", "BISECTOR_*"]


@pytest.mark.parametrize("place", PLACES)
def test_a_configured_state_dir_under_home_is_the_same_from_every_directory(place, make_repo, tmp_path, cli,
                                                                             state_is_good):
    """Item 4: `state_dir = "~/bisector-state"` made a folder named `~` under the current directory; a later
    `bisector runs` from another directory found no record."""
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    env = _configure(place, tmp_path, repo, "state_dir", "~/bisector-state")
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--", *state_is_good,
               cwd=here, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not (here / "~").exists() and not (repo.path / "~").exists()
    assert (tmp_path / "home" / "bisector-state" / "bisector-state").is_file()  # the state dir, marked
    listed = cli("runs", "--repo", str(repo.path), cwd=there, env=env)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.strip().splitlines()
    assert header.startswith("ID ") and len(rows) == 1 and shas[-1][:12] in rows[0], listed.stdout


@pytest.mark.parametrize("place", PLACES)
def test_a_configured_aiter_repo_under_home_is_expanded(place, make_repo, tmp_path, cli):
    """Item 4, the other path key: `aiter_repo = "~/mirrors/aiter.git"` stands for the folder under $HOME."""
    repo = make_repo()
    repo.commit("one", {"a": "1"})
    env = _configure(place, tmp_path, repo, "aiter_repo", "~/mirrors/aiter.git")
    proc = cli("doctor", "--repo", str(repo.path), cwd=tmp_path, env=env)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("config aiter_repo: "))
    assert line.startswith(f"config aiter_repo: {tmp_path / 'home' / 'mirrors' / 'aiter.git'} ("), line


@pytest.mark.parametrize("written, resolved", [("state-here", "config-home/bisector/state-here"),
                                               ("../state-beside", "config-home/state-beside")])
def test_a_relative_state_dir_in_a_config_file_is_taken_from_the_files_folder(written, resolved, make_repo,
                                                                              tmp_path, cli, state_is_good):
    """Item 4: a relative path in a config file means the same from every directory: the file's folder's."""
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    env = _configure("config.toml", tmp_path, repo, "state_dir", written)
    for cwd in (tmp_path, repo.path):
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--", *state_is_good,
                   cwd=cwd, env=env)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / resolved / "bisector-state").is_file()
    listed = cli("runs", "--repo", str(repo.path), cwd=repo.path, env=env)
    header, *rows = listed.stdout.strip().splitlines()
    assert header.startswith("ID ") and len(rows) == 2, listed.stdout  # both runs in the one record


def test_a_cache_dir_under_home_in_its_variable_is_expanded(make_repo, tmp_path, cli):
    """Item 4, a path-valued variable: BISECTOR_CACHE_DIR="~/gpu-cache" is the folder under $HOME."""
    repo = make_repo()
    sha = repo.commit("one", {"a": "1"})
    env = {"HOME": str(tmp_path / "home"), "BISECTOR_CACHE_DIR": "~/gpu-cache"}
    (tmp_path / "home").mkdir()
    judged = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--", "true", env=env)
    assert judged.returncode == 0, judged.stderr
    proc = cli("cache", "list", "--repo", str(repo.path), cwd=tmp_path, env=env)
    assert f"compile cache: {tmp_path / 'home' / 'gpu-cache'} " in proc.stderr, proc.stderr
    assert not (tmp_path / "~").exists()
