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
