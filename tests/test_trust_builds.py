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
    """v0.24.0, then two commits: the first carries the user's tag v2-good (the release glob's, no release),
    the last the user's lightweight tags s16 and try2."""
    shas = [repo.commit("release", {"setup.py": SCM_SETUP, "pyproject.toml": SCM_PYPROJECT, "vllm/__init__.py": "",
                                    "check_version.py": CHECK_VERSION,
                                    ".gitignore": "build/\n*.egg-info/\nvllm/_version.py\n"})]
    repo.git("tag", "-a", "-m", "v0.24.0", "v0.24.0")
    shas.append(repo.commit("work", {"vllm/work.py": "x = 1\n"}))
    repo.git("tag", "v2-good")
    shas.append(repo.commit("more work", {"vllm/work.py": "x = 2\n"}))
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
    develop = "".join(log.read_text() for log in state.rglob("build-*-develop.log"))
    assert "Can't parse version from tag" not in develop, develop[-2000:]
    assert proc.returncode == 0, (outcome, proc.stderr)
    assert outcome["verdict"] == "good" and "running build_ext" in develop
    assert repo.snapshot() == before


def test_the_told_version_is_setuptools_scms_own_guess_without_the_users_tags(make_repo, scm_python):
    from setuptools_scm import get_version

    from bisector.builds.version import release_version
    from bisector.repo.refs import GitRepo

    repo = make_repo()
    shas = scm_tree(repo)
    git = GitRepo(repo.path).git
    told = [release_version(lambda *args: git.execute(["git", *args]), sha) for sha in shas]
    repo.git("tag", "-d", "s16", "try2", "v2-good")
    repo.git("checkout", "-q", shas[1])
    own = get_version(root=str(repo.path))  # setuptools-scm itself, the user's tags gone
    assert told[1].split("+")[0] == own.split("+")[0] == "0.24.1.dev1"
    assert told == ["0.24.0+g" + shas[0][:12], "0.24.1.dev1+g" + shas[1][:12], "0.24.1.dev2+g" + shas[2][:12]]


def fake_vllm_history(repo) -> list[str]:
    """Three commits of a tree `--build auto` takes for vLLM, whose ROCm build would first pip install
    torch==2.10.0 from requirements/rocm-build.txt (as vLLM's does)."""
    shas = [repo.commit("base", {"setup.py": "from setuptools import setup\nsetup(name='vllm', packages=['vllm'])\n",
                                 "vllm/__init__.py": "", "csrc/native.c": "int native = 0;\n",
                                 "requirements/rocm-build.txt": "torch==2.10.0\nsetuptools\n",
                                 ".gitignore": "build/\n*.egg-info/\n"})]
    shas += [repo.commit(f"change {i}", {"vllm/work.py": f"x = {i}\n"}) for i in (1, 2)]
    return shas


@pytest.fixture
def users_python(tmp_path) -> Path:
    """The user's own interpreter: a virtual environment no step may install into."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "user-venv")], check=True)
    return tmp_path / "user-venv" / "bin" / "python"


def installed(python: Path) -> list[str]:
    """Everything in python's site-packages, and its `pip freeze`."""
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    freeze = subprocess.run([str(python), "-m", "pip", "freeze", "--all"], check=True, capture_output=True,
                            text=True).stdout
    return sorted(str(p.relative_to(purelib)) for p in Path(purelib).rglob("*")) + freeze.splitlines()


def test_the_gpu_scenario_on_a_machine_without_gpu_skips_before_any_build_or_install(make_repo, users_python,
                                                                                     tmp_path, cli):
    if Path("/dev/kfd").exists() or Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has a GPU: the scenario would run")
    repo = make_repo()
    shas = fake_vllm_history(repo)
    before, site_before = repo.snapshot(), installed(users_python)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--scenario",
               "dpa-fp8-kv-graph-capture", "--python", str(users_python), "--state-dir", str(state),
               "--json", str(tmp_path / "r.json"), env={"PIP_NO_INDEX": "1"})  # at its defaults: auto, shared
    # the good end cannot be judged here: the run stops at its endpoint check, saying why
    assert proc.returncode == 3, proc.stderr
    assert "this machine cannot run it: no usable GPU (rocm: /dev/kfd missing" in proc.stderr, proc.stderr
    assert not list(state.rglob("build-*")), "a build ran (or pip installed) on a machine without GPU"
    assert installed(users_python) == site_before
    assert repo.snapshot() == before


def test_a_build_never_installs_into_the_users_python_without_the_opt_in(make_repo, users_python, tmp_path, cli):
    repo = make_repo()
    shas = fake_vllm_history(repo)
    site_before = installed(users_python)
    common = ("scenario", "run", "command", "--repo", str(repo.path), "--ref", shas[-1], "--build", "source",
              "--python", str(users_python), "--state-dir", str(tmp_path / "state"))
    refused = cli(*common, "--", "true", env={"PIP_NO_INDEX": "1"})
    assert refused.returncode == 125, refused.stderr
    assert "source build refused" in refused.stdout and "-m pip install -r requirements/rocm-build.txt" \
        in refused.stdout and "--allow-install-into-python" in refused.stdout, refused.stdout
    assert not list((tmp_path / "state").rglob("build-*"))
    assert installed(users_python) == site_before
    # with the opt-in the build installs what the commit asks (here: offline, so pip fails and says so)
    allowed = cli(*common, "--allow-install-into-python", "--", "true", env={"PIP_NO_INDEX": "1"})
    assert allowed.returncode == 125 and "build-requirements exited 1" in allowed.stdout, allowed.stdout
    assert list((tmp_path / "state").rglob("build-*-build-requirements.log"))


def test_a_develop_in_the_users_python_fetches_no_missing_requirement(make_repo, users_python, tmp_path, cli):
    """setuptools' `setup.py develop` would fetch install_requires missing from --python into it."""
    repo = make_repo()
    sha = repo.commit("tree", {"vllm/__init__.py": "", ".gitignore": "build/\n*.egg-info/\n",
                               "setup.py": "from setuptools import setup\nsetup(name='vllm', version='0', "
                                           "packages=['vllm'], install_requires=['bisector-absent-pkg'])\n"})
    freeze = [str(users_python), "-m", "pip", "freeze", "--all"]
    before = subprocess.run(freeze, check=True, capture_output=True, text=True).stdout
    proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", sha, "--build", "source",
               "--python", str(users_python), "--state-dir", str(tmp_path / "state"),
               "--", str(users_python), "-c", "import vllm", env={"PIP_NO_INDEX": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = subprocess.run(freeze, check=True, capture_output=True, text=True).stdout
    assert "absent" not in after
    # nor the worktree's link (an egg-link): the step imports the worktree through PYTHONPATH
    assert after == before


# vLLM's precompiled path in miniature: with VLLM_USE_PRECOMPILED the wheel is opened before anything else.
PRECOMPILED_SETUP = '''\
import os, zipfile
if os.environ.get("VLLM_USE_PRECOMPILED") == "1":
    zipfile.ZipFile(os.environ["VLLM_PRECOMPILED_WHEEL_LOCATION"]).namelist()
from setuptools import setup
setup(name="vllm", version="0", packages=["vllm"])
'''


def test_auto_names_why_the_wheel_failed_and_why_no_source_build_followed(make_repo, users_python, tmp_path, cli):
    """`--build auto`: the commit's wheel is broken, and the source build that would follow would install
    into the user's --python: the skip says both, the wheel's failure first with its cause and log."""
    repo = make_repo()
    shas = fake_vllm_history(repo)
    shas.append(repo.commit("precompiled path", {"setup.py": PRECOMPILED_SETUP}))
    wheels = tmp_path / "wheels" / shas[-1]
    wheels.mkdir(parents=True)
    (wheels / "vllm-0-cp311-abi3-linux_x86_64.whl").write_text("not a zip")
    site_before = installed(users_python)
    proc = cli("scenario", "run", "command", "--repo", str(repo.path), "--ref", shas[-1], "--build", "auto",
               "--wheels", str(tmp_path / "wheels"), "--python", str(users_python), "--state-dir",
               str(tmp_path / "state"), "--", "true", env={"PIP_NO_INDEX": "1"})
    assert proc.returncode == 125, proc.stdout + proc.stderr
    assert "precompiled failed: develop-precompiled exited 1 (" in proc.stdout, proc.stdout
    wheel_failed = proc.stdout.index("precompiled failed: develop-precompiled exited 1 (")
    assert "): zipfile.BadZipFile: File is not a zip file (log " in proc.stdout, proc.stdout
    log = proc.stdout.split("zipfile.BadZipFile: File is not a zip file (log ", 1)[1].split(")")[0]
    assert log.endswith("-develop-precompiled.log") and "BadZipFile" in Path(log).read_text(), proc.stdout
    source_refused = proc.stdout.index("source build refused: `")
    assert wheel_failed < source_refused and "--allow-install-into-python allows it" in proc.stdout, proc.stdout
    assert not list((tmp_path / "state").rglob("build-*-build-requirements.log"))
    assert installed(users_python) == site_before
