"""Shared fixtures: real git repositories built in temp dirs, the CLI run as a subprocess.

Every test module says what it is with a module-level `pytestmark`: `unit` (pure logic, in-process) or
`integration` (real git repositories, subprocesses, the CLI); `gpu_plan` (GPU placement and launch plans,
checked without a GPU) and `slow` (seconds or more each) come on top. A test without `unit` or
`integration` fails at collection, and a `unit` test that starts a process fails (the marker says the truth).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bisector.repo.archives import extract

_ROOT = Path(__file__).resolve().parents[1]
_GIT_ENV = {"GIT_AUTHOR_NAME": "Test Author", "GIT_AUTHOR_EMAIL": "author@example.com",
            "GIT_COMMITTER_NAME": "Test Committer", "GIT_COMMITTER_EMAIL": "committer@example.com",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00"}
_KINDS = ("unit", "integration")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` runs at least four workers: many tests wait on processes (a driver killed and resumed, a step
    timing out) more than they compute, so on a 2-core machine four workers end the suite sooner than two (482 s
    against 522 s here)."""
    return max(4, len(os.sched_getaffinity(0)))


def pytest_collection_modifyitems(config, items):
    """Refuse a test that does not say whether it is a unit or an integration test."""
    unmarked = [item.nodeid for item in items if not any(item.get_closest_marker(kind) for kind in _KINDS)]
    if unmarked:
        raise pytest.UsageError(f"tests without a 'unit' or 'integration' marker: {', '.join(unmarked)}")


class _NoProcessInUnitTests(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
        raise AssertionError(f"a unit test starts no process (mark it integration): {args!r}"[:300])


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request, monkeypatch):
    """A `unit` test is pure logic in-process: every subprocess it would start (git through GitPython too) fails it."""
    if request.node.get_closest_marker("unit") and not request.node.get_closest_marker("integration"):
        import git.cmd  # GitPython holds its own name for Popen
        monkeypatch.setattr(subprocess, "Popen", _NoProcessInUnitTests)
        monkeypatch.setattr(git.cmd, "Popen", _NoProcessInUnitTests)
        monkeypatch.setattr(git.cmd, "safer_popen", _NoProcessInUnitTests)


@pytest.fixture(autouse=True)
def _private_cache_root(tmp_path_factory, monkeypatch):
    """No test writes the tool's shared GPU caches under the real home: $BISECTOR_CACHE_DIR per test."""
    monkeypatch.setenv("BISECTOR_CACHE_DIR", str(tmp_path_factory.mktemp("cache-root")))
    # and no test reads the user's configuration (bisector.cli.config): an empty config home, no BISECTOR_<KEY>
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config-home")))
    for key in ("AITER_REPO", "EXECUTOR", "GPUS", "IMAGE", "STATE_DIR"):
        monkeypatch.delenv(f"BISECTOR_{key}", raising=False)


_FIXED_TIME = "1767225600 +0000"  # _GIT_ENV's dates, as git fast-import takes them


def _data(text: str) -> list[str]:
    """A git fast-import data block holding text (no newline is added after it)."""
    return [f"data {len(text.encode())}", text]


def _git(repo: Path, *args: str) -> str:
    """Run git with an argument list in repo; returns stdout stripped."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **_GIT_ENV}).stdout.strip()


class RepoBuilder:
    """A real git repository in a temp dir, grown commit by commit."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        """Run git in this repository; returns stdout stripped."""
        return _git(self.path, *args)

    def commit(self, message: str, files: dict[str, str | None]) -> str:
        """Write (or delete, with None) files and commit them; returns the new sha."""
        for name, content in files.items():
            target = self.path / name
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def linear(self, count: int, bad_from: int | None, start: int = 0) -> list[str]:
        """count commits; from index bad_from on the file `state` says bad. Returns shas.

        The commits `commit` would make, written by one `git fast-import` (three git runs a commit cost
        minutes on a loaded machine); `commit` itself while the work tree holds changes it would add.
        """
        def files(i: int) -> dict[str, str]:
            return {"counter.txt": f"{i}\n", "state": "bad\n" if bad_from is not None and i >= bad_from else "good\n"}

        branch, parent = (subprocess.run(["git", "-C", str(self.path), *args], capture_output=True,
                                         text=True).stdout.strip()
                          for args in (["symbolic-ref", "-q", "HEAD"], ["rev-parse", "-q", "--verify", "HEAD"]))
        if not branch or self.git("status", "--porcelain", "--untracked-files=all"):  # detached, or changes
            return [self.commit(f"change {i} (#{1000 + i})", files(i)) for i in range(start, start + count)]
        stream = []
        for n, i in enumerate(range(start, start + count), 1):
            stream += [f"commit {branch}", f"mark :{n}"]
            stream += [f"{role} {_GIT_ENV[f'GIT_{role.upper()}_NAME']} <{_GIT_ENV[f'GIT_{role.upper()}_EMAIL']}> "
                       f"{_FIXED_TIME}" for role in ("author", "committer")]
            stream += _data(f"change {i} (#{1000 + i})\n")
            if n == 1 and parent:
                stream.append(f"from {parent}")
            for name, content in files(i).items():
                stream += [f"M 100644 inline {name}", *_data(content)]
        marks = self.path / ".git" / "linear-marks"
        subprocess.run(["git", "-C", str(self.path), "fast-import", "--quiet", f"--export-marks={marks}"],
                       input="\n".join(stream) + "\n", check=True, capture_output=True, text=True,
                       env={**os.environ, **_GIT_ENV})
        self.git("reset", "-q", "--hard")  # index and work tree at the new head, as `commit` leaves them
        by_mark = dict(line.split() for line in marks.read_text().splitlines())
        marks.unlink()
        return [by_mark[f":{n}"] for n in range(1, count + 1)]

    def snapshot(self) -> dict:
        """Everything a bisection must leave as it was: HEAD, refs, index, working tree status."""
        return {"head": self.git("rev-parse", "HEAD"),
                "symbolic": self.git("symbolic-ref", "-q", "HEAD"),
                "refs": self.git("for-each-ref"),
                "index": (self.path / ".git" / "index").read_bytes(),
                "status": self.git("status", "--porcelain", "--untracked-files=all"),
                "worktrees": self.git("worktree", "list", "--porcelain")}


def _run_cli(*args: str, cwd: Path | None = None, env: dict | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (python -m bisector.cli) on this checkout."""
    return subprocess.run([sys.executable, "-m", "bisector.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, **_GIT_ENV, "PYTHONPATH": str(_ROOT), **(env or {})})


def _pid_alive(pid: int) -> bool:
    """Whether pid runs: a zombie (killed, its parent gone, not yet reaped by init) does not."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="session")
def project_root() -> Path:
    """The checkout under test (what the CLI subprocesses get as PYTHONPATH)."""
    return _ROOT


@pytest.fixture(scope="session")
def git_env() -> dict:
    """Fixed git identities and dates, so commits are reproducible."""
    return dict(_GIT_ENV)


@pytest.fixture(scope="session")
def git():
    """git(repo, *args) -> stdout stripped; an argument list, never a shell."""
    return _git


@pytest.fixture(scope="session")
def cli():
    """cli(*args, cwd=, env=, timeout=) -> CompletedProcess of `python -m bisector.cli *args`."""
    return _run_cli


@pytest.fixture(scope="session")
def repo_builder():
    """The RepoBuilder class, for repositories at a chosen path (e.g. in module-scoped fixtures)."""
    return RepoBuilder


@pytest.fixture
def make_repo(tmp_path):
    """Factory: make_repo(name) -> RepoBuilder of a fresh repository under tmp_path."""
    return lambda name="repo": RepoBuilder(tmp_path / name)


@pytest.fixture
def state_is_good() -> list[str]:
    """A command scenario judging the checkout by its `state` file: exit 0 good, 1 bad."""
    return ["grep", "-q", "good", "state"]


@pytest.fixture(scope="session")
def pid_alive():
    """pid_alive(pid) -> whether a process with that pid still exists."""
    return _pid_alive


def _wait_for(predicate, seconds: float = 120.0) -> bool:
    """Poll predicate until it holds (True) or seconds pass (False). The deadline only ends a wait for
    something that is broken: on a loaded CI machine, events that take a second here take many."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="session")
def wait_for():
    """wait_for(predicate, seconds=120) -> whether predicate came to hold before the deadline."""
    return _wait_for


@pytest.fixture
def script_scenario(tmp_path):
    """script_scenario(body) -> a CommandScenario running body in sh, with $n the checkout's counter and
    $PIDS the test's tmp_path (where the script leaves pids and flags)."""
    from scenarios.command import CommandScenario

    def make(body: str) -> CommandScenario:
        script = tmp_path / "scenario.sh"
        script.write_text(f'n=$(cat counter.txt)\nPIDS={tmp_path}\n{body}\n')
        return CommandScenario(["sh", str(script)])

    return make


@pytest.fixture(scope="session")
def deciding_answer_kills_the_rest() -> str:
    """Scenario body: commit 2 sleeps (recording its pid); commit 1, the culprit, answers once commit 2
    is running. With 4 commits and 2 jobs, the culprit's answer must kill commit 2's step. The sleep is
    long (600 s) so that a run that waited for it stands out from any run slowed by load."""
    return """
case $n in
  2) echo $$ > $PIDS/sleeper; exec sleep 600;;
  1) while [ ! -f $PIDS/sleeper ]; do sleep 0.05; done; exit 1;;
esac
grep -q good state
"""


# -- real vLLM release source, shared by every worker ------------------------------------------------
SDIST_CACHE = Path(os.environ.get("VLLM_SDIST_CACHE", Path.home() / ".cache" / "vllm-sdists"))


@contextlib.contextmanager
def cache_lock():
    """Hold SDIST_CACHE for this process: pytest-xdist workers must not fetch or extract into it at once."""
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    with open(SDIST_CACHE / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def fetch_sdists(versions) -> None:
    """Download the missing vllm-X.tar.gz into SDIST_CACHE from pip's default index."""
    missing = [v for v in versions if not (SDIST_CACHE / f"vllm-{v}.tar.gz").exists()]
    if not missing:
        return
    from pip._internal.models.index import PyPI
    from pip._internal.network.session import PipSession
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    session = PipSession()
    index = session.get(PyPI.simple_url.rstrip("/") + "/vllm/",
                        headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    index.raise_for_status()
    urls = {f["filename"]: f["url"] for f in index.json()["files"]}
    for version in missing:
        name = f"vllm-{version}.tar.gz"
        response = session.get(urls[name])
        response.raise_for_status()
        partial = SDIST_CACHE / (name + ".part")
        partial.write_bytes(response.content)
        partial.replace(SDIST_CACHE / name)


def python_sources(version: str) -> Path:
    """The release's vllm/**.py files, extracted once next to its sdist; read-only for the probe."""
    dest = SDIST_CACHE / "python-sources" / version
    if not dest.exists():
        partial = dest.with_name(version + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        extract_python_sources(SDIST_CACHE / f"vllm-{version}.tar.gz", partial)
        partial.rename(dest)
    return dest


def extract_python_sources(sdist: Path, dest: Path) -> None:
    """Extract only the sdist's vllm/**.py files into dest/vllm."""
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar:
            top, _, relative = member.name.partition("/")
            if member.isfile() and relative.startswith("vllm/") and relative.endswith(".py"):
                member.name = relative
                members.append(member)
        extract(tar, dest, members)


@pytest.fixture(scope="session")
def vllm_sdist():
    """vllm_sdist(version) -> the release's sdist (vllm-X.tar.gz), fetched once under a file lock; skips the
    test when the registry cannot be reached and nothing is cached."""
    def sdist(version: str) -> Path:
        with cache_lock():
            try:
                fetch_sdists([version])
            except Exception as exc:  # the registry is unreachable: nothing to check against
                pytest.skip(f"cannot download vLLM {version} into {SDIST_CACHE}: {type(exc).__name__}: {exc}")
        return SDIST_CACHE / f"vllm-{version}.tar.gz"
    return sdist


@pytest.fixture(scope="session")
def vllm_sources(vllm_sdist):
    """vllm_sources(version) -> the release's vllm/**.py tree (read-only), fetched and extracted once under
    a file lock; skips the test when the registry cannot be reached and nothing is cached."""
    def sources(version: str) -> Path:
        vllm_sdist(version)
        with cache_lock():
            return python_sources(version)
    return sources


def _why_no_wheel_build() -> str | None:
    """Why this interpreter cannot build a local setuptools package into a wheel (pip install of a path,
    `setup.py bdist_wheel`); None where it can."""
    import importlib.util

    if importlib.util.find_spec("setuptools") is None:
        return "setuptools is not installed (pip install 'bisector[test]')"
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is None and \
            importlib.util.find_spec("wheel") is None:
        return "no bdist_wheel: setuptools < 70.1 without the wheel package (pip install 'bisector[test]')"
    return None


@pytest.fixture(scope="session")
def wheel_build():
    """Skips the test where a local package cannot be built into a wheel; CI installs what it needs."""
    reason = _why_no_wheel_build()
    if reason:
        pytest.skip(reason)
