"""Builds the user's own repository cannot steer: a user's tag never decides the version a build gets
(issue 30 item 4), and a scenario that cannot run on this machine skips before anything is built or
installed into the user's --python (item 5)."""
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# vLLM's way of asking setuptools-scm (setup.py's get_vllm_version): get_version() without a name.
SCM_SETUP = '''\
from setuptools import setup
from setuptools_scm import get_version
setup(name="vllm", version=get_version(write_to="vllm/_version.py"), packages=["vllm"])
'''
SCM_PYPROJECT = '''\
[build-system]
requires = ["setuptools", "setuptools-scm"]
[project]
name = "vllm"
dynamic = ["version"]
[tool.setuptools_scm]
'''
CHECK_VERSION = '''\
import sys
from vllm._version import version
print("version", version)
sys.exit(0 if version == sys.argv[1] else 1)
'''


@pytest.fixture(scope="module")
def scm_python(tmp_path_factory) -> str:
    """A throwaway environment (`setup.py develop` registers the tree there) that imports setuptools-scm."""
    pytest.importorskip("setuptools_scm", reason="setuptools-scm is not installed (pip install setuptools-scm)")
    path = tmp_path_factory.mktemp("scm-venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "_bisector_test_base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(python)


def scm_tree(repo) -> list[str]:
    """v0.24.0, then two commits: the last carries the user's lightweight tags s16 and try2."""
    shas = [repo.commit("release", {"setup.py": SCM_SETUP, "pyproject.toml": SCM_PYPROJECT, "vllm/__init__.py": "",
                                    "check_version.py": CHECK_VERSION,
                                    ".gitignore": "build/\n*.egg-info/\nvllm/_version.py\n"})]
    repo.git("tag", "-a", "-m", "v0.24.0", "v0.24.0")
    shas += [repo.commit("work", {"vllm/work.py": "x = 1\n"}), repo.commit("more work", {"vllm/work.py": "x = 2\n"})]
    repo.git("tag", "s16")
    repo.git("tag", "try2")
    return shas


def test_a_users_tag_on_the_commit_never_decides_the_built_version(make_repo, scm_python, tmp_path, cli):
    repo = make_repo()
    shas = scm_tree(repo)
    before = repo.snapshot()
    expected = f"0.24.1.dev2+g{shas[-1][:12]}"
    state = tmp_path / "state"
    proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", "s16", "--build", "auto",
               "--python", scm_python, "--state-dir", str(state), "--json", str(tmp_path / "o.json"),
               "--", scm_python, "check_version.py", expected)
    outcome = json.loads((tmp_path / "o.json").read_text())
    develop = "".join(log.read_text() for log in (state / "logs").glob("build-*-develop.log"))
    assert "Can't parse version from tag" not in develop, develop[-2000:]
    assert proc.returncode == 0, (outcome, proc.stderr)
    assert outcome["verdict"] == "good" and "running develop" in develop
    assert repo.snapshot() == before


def test_the_told_version_is_setuptools_scms_own_guess_without_the_users_tags(make_repo, scm_python):
    from setuptools_scm import get_version

    from bisector.builds.version import release_version
    from bisector.refs import GitRepo

    repo = make_repo()
    shas = scm_tree(repo)
    git = GitRepo(repo.path).git
    told = [release_version(lambda *args: git.execute(["git", *args]), sha) for sha in shas]
    repo.git("tag", "-d", "s16", "try2")
    repo.git("checkout", "-q", shas[1])
    own = get_version(root=str(repo.path))  # setuptools-scm itself, the user's tags gone
    assert told[1].split("+")[0] == own.split("+")[0] == "0.24.1.dev1"
    assert told == ["0.24.0+g" + shas[0][:12], "0.24.1.dev1+g" + shas[1][:12], "0.24.1.dev2+g" + shas[2][:12]]
