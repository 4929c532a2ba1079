"""How a step's worktree becomes runnable: build strategies behind one interface.

A commit's native-input hash (tree ids of the paths that decide the compiled extensions, plus the
toolchain) keys an artifact cache under <state_dir>/artifacts/<hash>/; `auto` picks per step the
cheapest valid strategy: reuse those artifacts, else a precompiled wheel, else vLLM's ROCm source build.
"""
from __future__ import annotations

import dataclasses
import hashlib
import html.parser
import json
import os
import platform
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bisector.process import run_process
from bisector.refs import GitRepo
from bisector.store import BuildRecord, Store
from bisector.worktrees import clean_ignored, untracked_files

STRATEGIES = ("auto", "source", "precompiled", "python", "none")
# Paths whose content decides the compiled extensions (vLLM's docker/Dockerfile.rocm build stage).
NATIVE_PATHS = ("csrc", "CMakeLists.txt", "cmake", "setup.py", "pyproject.toml",
                "requirements/rocm-build.txt", "requirements/build/rocm.txt", "rust", "tools/build_rust.py")
# ROCm build requirements: requirements/build/rocm.txt from 0.20, requirements/rocm-build.txt before.
BUILD_REQUIREMENTS = ("requirements/build/rocm.txt", "requirements/rocm-build.txt")
DEFAULT_ARCH = "gfx942"
DEFAULT_CACHE_SIZE = "50G"
EXTENSION_PATTERN = "*.so"
# A source build compiles; everything else only copies files.
COMPILE_COST, FREE_COST, KNOWN_FAILURE_COST = 1.0, 0.0, 2.0


@dataclass(frozen=True)
class BuildResult:
    strategy: str
    ok: bool
    reason: str
    log_path: str | None = None
    env: dict = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """What ran and why, as stored per step: 'python: native 1a2b3c4d5e6f built before'."""
        return f"{self.strategy}: {self.reason}"


class NoBuild:
    """The tree runs as checked out (the CPU probe, or a command that builds for itself)."""

    name = "none"

    def open(self, repo: GitRepo, state_dir: Path) -> "NoBuild":
        return self

    def cost(self, sha: str) -> float:
        return FREE_COST

    def decide(self, sha: str) -> "Decision":
        return Decision("none", "no build", "", ())

    def prepare(self, worktree: Path, sha: str, log_dir: Path) -> BuildResult:
        return BuildResult("none", True, "no build")


# -- toolchain and native hash ---------------------------------------------------------------------
@dataclass(frozen=True)
class Toolchain:
    rocm: str
    torch: str
    python: str
    arch: str

    def fingerprint(self) -> str:
        return f"rocm={self.rocm} torch={self.torch} python={self.python} arch={self.arch}"


# Reads torch's version and HIP version from its metadata and version.py, without importing torch.
_PROBE = """
import importlib.metadata, importlib.util, pathlib, re, sys
print('%d.%d' % sys.version_info[:2])
try:
    print(importlib.metadata.version('torch'))
    text = (pathlib.Path(importlib.util.find_spec('torch').origin).parent / 'version.py').read_text()
    hip = re.search(r"^hip[^=]*=\\s*'([^']+)'", text, re.M)
    print(hip.group(1) if hip else 'none')
except Exception:
    print('none')
    print('none')
"""


def detect_toolchain(python: str, arch: str | None) -> Toolchain:
    """ROCm version, torch version and Python version of the build's interpreter, and the arch list."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                             check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        raise ValueError(f"cannot run the build's Python: {python}") from None
    py_version, torch_version, hip_version = (out + ["none"] * 3)[:3]
    return Toolchain(rocm=installed_rocm_version() or hip_version, torch=torch_version,
                     python=py_version,
                     arch=arch or os.environ.get("PYTORCH_ROCM_ARCH") or gpu_arch() or DEFAULT_ARCH)


def rocm_root() -> Path:
    return Path(os.environ.get("ROCM_PATH", "/opt/rocm"))


def installed_rocm_version() -> str | None:
    """The ROCm release installed under ROCM_PATH (default /opt/rocm), from its .info/version."""
    try:
        return (rocm_root() / ".info" / "version").read_text().strip() or None
    except OSError:
        return None


def gpu_arch() -> str | None:
    """The gfx targets of the GPUs rocminfo reports, ';'-joined as PYTORCH_ROCM_ARCH wants."""
    if shutil.which("rocminfo") is None:
        return None
    try:
        out = subprocess.run(["rocminfo"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = sorted(set(re.findall(r"^\s*Name:\s*(gfx[0-9a-f]+)\s*$", out, re.MULTILINE)))
    return ";".join(found) or None


def native_hash(tree_ids: Mapping[str, str], toolchain: Toolchain) -> str:
    """Identity of a commit's compiled outputs: its native input trees plus the toolchain."""
    blob = json.dumps({"trees": dict(sorted(tree_ids.items())), "toolchain": toolchain.fingerprint()})
    return hashlib.sha256(blob.encode()).hexdigest()


def parse_size(text: str) -> int:
    """'50G', '512M', '10k' or plain bytes -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"not a size: {text!r} (e.g. 50G, 512M)")
    return int(float(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " "))


# -- build plans (pure) -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]
    env: dict

    def as_dict(self) -> dict:
        return {"label": self.label, "argv": list(self.argv), "env": self.env}


def compiler_launcher() -> str | None:
    """The launcher vLLM's setup.py itself picks: sccache if on PATH, else ccache."""
    return next((name for name in ("sccache", "ccache") if shutil.which(name)), None)


def source_plan(python: str, worktree: Path, requirements: str | None, toolchain: Toolchain,
                max_jobs: int, launcher: str | None, cache_dir: Path) -> list[Command]:
    """vLLM's documented ROCm build: install the commit's build requirements, `setup.py develop`."""
    env = {"PYTORCH_ROCM_ARCH": toolchain.arch, "MAX_JOBS": str(max_jobs)}
    if launcher == "sccache":
        env["SCCACHE_DIR"] = str(cache_dir / "sccache")
    elif launcher == "ccache":
        env.update(CCACHE_DIR=str(cache_dir / "ccache"), CCACHE_BASEDIR=str(worktree))
    commands = []
    if requirements:
        commands.append(Command("build-requirements", (python, "-m", "pip", "install", "-r", requirements),
                                {}))
    commands.append(Command("develop", (python, "setup.py", "develop"), env))
    return commands


def precompiled_plan(python: str, wheel: str) -> list[Command]:
    """Install the commit's Python over compiled files taken from a wheel (vLLM's precompiled path)."""
    return [Command("develop-precompiled", (python, "setup.py", "develop"),
                    {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_LOCATION": wheel})]


# -- wheels -----------------------------------------------------------------------------------------
class WheelSource:
    """Per-commit wheels: a local directory (DIR/<sha>/*.whl or *+g<sha prefix>*.whl) or a URL
    template with {commit} naming a wheel or an index page listing wheels."""

    def __init__(self, spec: str):
        self.spec = spec
        self.is_url = "://" in spec
        if self.is_url and "{commit}" not in spec:
            raise ValueError(f"--wheels URL template needs {{commit}}: {spec}")
        if not self.is_url and not Path(spec).is_dir():
            raise ValueError(f"--wheels is neither a directory nor a URL template: {spec}")
        self.found: dict[str, str | None] = {}
        self.lock = threading.Lock()

    def locate(self, sha: str) -> str | None:
        """Location of sha's wheel (path or URL) if one is available; remembered per commit."""
        with self.lock:
            if sha not in self.found:
                self.found[sha] = self._url(sha) if self.is_url else self._local(sha)
            return self.found[sha]

    def _local(self, sha: str) -> str | None:
        base = Path(self.spec)
        wheels = sorted((base / sha).glob("*.whl"))
        for wheel in sorted(base.glob("*.whl")):
            match = re.search(r"\+g([0-9a-f]{7,40})", wheel.name)
            if match and sha.startswith(match.group(1)):
                wheels.append(wheel)
        return str(wheels[0].resolve()) if wheels else None

    def _url(self, sha: str) -> str | None:
        url = self.spec.replace("{commit}", sha)
        try:
            if url.endswith(".whl"):
                with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10):
                    return url
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = resp.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return None
        links = _wheel_links(page)
        machine = [link for link in links if platform.machine() in link]
        chosen = (machine or links or [None])[0]
        return urllib.parse.urljoin(url, chosen) if chosen else None


def _wheel_links(page: str) -> list[str]:
    links: list[str] = []

    class Parser(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            href = dict(attrs).get("href") or ""
            if tag == "a" and href.split("#")[0].endswith(".whl"):
                links.append(href.split("#")[0])

    Parser().feed(page)
    return links


# -- artifacts ----------------------------------------------------------------------------------------
class ArtifactCache:
    """Compiled outputs by native hash under <state_dir>/artifacts/<hash>/, LRU-evicted to a size cap."""

    def __init__(self, state_dir: Path, cap_bytes: int):
        self.root = Path(state_dir) / "artifacts"
        self.db_path = Path(state_dir) / "bisector.sqlite"
        self.cap = cap_bytes
        self.lock = threading.Lock()
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        with self._store() as store:
            self.records = {r.native_hash: r for r in store.builds()}

    def _store(self) -> Store:
        """A connection for this thread (steps build on worker threads)."""
        return Store(self.db_path)

    def get(self, native: str) -> BuildRecord | None:
        with self.lock:
            return self.records.get(native)

    def restore(self, native: str, worktree: Path) -> list[str]:
        """Copy the stored outputs into the worktree; marks them used."""
        record = self.get(native)
        for rel in record.files:
            target = worktree / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(record.artifact_dir) / rel, target)
        now = time.time()
        with self.lock, self._store() as store:
            store.touch_build(native, now)
            self.records[native] = dataclasses.replace(record, last_used=now)
        return list(record.files)

    def save(self, native: str, worktree: Path, files: list[str], strategy: str, log_path: str | None) -> None:
        """Store a successful build's outputs, then evict least recently used ones over the cap."""
        final = self.root / native
        staging = self.root / f".{native}.{os.getpid()}.{threading.get_ident()}"
        shutil.rmtree(staging, ignore_errors=True)
        for rel in files:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(worktree / rel, staging / rel)
        staging.mkdir(parents=True, exist_ok=True)
        size = sum((staging / rel).stat().st_size for rel in files)
        with self.lock:
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
            record = BuildRecord(native, "ok", strategy, log_path, str(final), tuple(files), size,
                                 time.time())
            with self._store() as store:
                store.put_build(record)
                self.records[native] = record
                self._evict(store, keep=native)

    def fail(self, native: str, strategy: str, log_path: str | None) -> None:
        record = BuildRecord(native, "failed", strategy, log_path, None, (), 0, time.time())
        with self.lock, self._store() as store:
            store.put_build(record)
            self.records[native] = record

    def _evict(self, store: Store, keep: str) -> None:
        stored = sorted((r for r in self.records.values() if r.status == "ok"), key=lambda r: r.last_used)
        total = sum(r.size for r in stored)
        for record in stored:
            if total <= self.cap:
                break
            if record.native_hash == keep:
                continue
            shutil.rmtree(record.artifact_dir, ignore_errors=True)
            store.delete_build(record.native_hash)
            del self.records[record.native_hash]
            total -= record.size


# -- the builder ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """What a step's build would do, decided from git objects and the cache alone."""

    strategy: str  # python | precompiled | source | failed-before | unavailable
    reason: str
    native: str
    commands: tuple[Command, ...]


@dataclass(frozen=True)
class BuildSettings:
    """What the user asked for; `open` binds it to a repository and state dir for one run."""

    strategy: str = "auto"
    python: str = "python3"
    rocm_arch: str | None = None
    wheels: str | None = None
    cache_size: int = parse_size(DEFAULT_CACHE_SIZE)
    max_jobs: int = int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)

    def open(self, repo: GitRepo, state_dir: Path):
        if self.strategy == "none":
            return NoBuild()
        return Builder(self, repo, Path(state_dir))


class Builder:
    """Prepares a worktree for one commit by the cheapest valid strategy the settings allow."""

    def __init__(self, settings: BuildSettings, repo: GitRepo, state_dir: Path):
        self.settings, self.repo, self.state_dir = settings, repo, state_dir
        self.name = settings.strategy
        self.toolchain = detect_toolchain(settings.python, settings.rocm_arch)
        self.wheels = WheelSource(settings.wheels) if settings.wheels else None
        self.cache = ArtifactCache(state_dir, settings.cache_size)
        self.compiler_cache = state_dir / "compiler-cache"
        self.trees: dict[str, dict[str, str]] = {}
        self.hash_locks: dict[str, threading.Lock] = {}
        self.lock = threading.Lock()

    def native_trees(self, sha: str) -> dict[str, str]:
        with self.lock:
            if sha not in self.trees:
                self.trees[sha] = self.repo.tree_ids(sha, NATIVE_PATHS)
            return self.trees[sha]

    def native(self, sha: str) -> str:
        return native_hash(self.native_trees(sha), self.toolchain)

    def cost(self, sha: str) -> float:
        """0 when no compile is needed (built before, or a wheel), 1 for a compile, 2 for a known failure."""
        decision = self.decide(sha)
        if decision.strategy in ("failed-before", "unavailable"):
            return KNOWN_FAILURE_COST
        return COMPILE_COST if decision.strategy == "source" else FREE_COST

    def decide(self, sha: str, worktree: Path | None = None, wanted: str | None = None) -> Decision:
        """The build sha needs under the chosen (or `wanted`) strategy, with the commands it would run."""
        native = self.native(sha)
        if "setup.py" not in self.native_trees(sha):
            return Decision("none", "no setup.py at this commit", native, ())
        short = native[:12]
        record = self.cache.get(native)
        wanted = wanted or self.settings.strategy
        if record and record.status == "failed":
            return Decision("failed-before", f"native {short} failed to build before ({record.strategy})",
                            native, ())
        if wanted in ("auto", "python") and record:
            return Decision("python", f"native {short} built before", native, ())
        if wanted == "python":
            return Decision("unavailable", f"native {short} never built (--build python)", native, ())
        worktree = worktree or self.state_dir / "worktrees" / "slot-N"
        python = self.settings.python
        if wanted in ("auto", "precompiled"):
            wheel = self.wheels.locate(sha) if self.wheels else None
            if wheel:
                return Decision("precompiled", f"native {short} not built, wheel {Path(wheel).name}",
                                native, tuple(precompiled_plan(python, wheel)))
            if wanted == "precompiled":
                return Decision("unavailable", f"no wheel for {sha[:12]} (--build precompiled)", native, ())
        requirements = next((path for path in BUILD_REQUIREMENTS if path in self.native_trees(sha)), None)
        why = "--build source" if self.settings.strategy == "source" else \
            f"native {short} not built" + (", no wheel" if self.wheels else "")
        return Decision("source", why, native,
                        tuple(source_plan(python, worktree, requirements, self.toolchain,
                                          self.settings.max_jobs, compiler_launcher(), self.compiler_cache)))

    def prepare(self, worktree: Path, sha: str, log_dir: Path) -> BuildResult:
        """Make worktree runnable for sha: stale outputs out, then reuse, wheel or compile."""
        native = self.native(sha)
        with self.lock:
            hash_lock = self.hash_locks.setdefault(native, threading.Lock())
        with hash_lock:  # two slots never build the same native inputs at once
            remove_outputs(worktree)
            env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(worktree), os.environ.get("PYTHONPATH")]))}
            decision = self.decide(sha, worktree)
            if decision.strategy == "none":
                return BuildResult("none", True, decision.reason)
            if decision.strategy == "failed-before":
                return BuildResult("source", False, decision.reason, self.cache.get(native).log_path)
            if decision.strategy == "unavailable":
                return BuildResult(self.settings.strategy, False, decision.reason)
            if decision.strategy == "python":
                files = self.cache.restore(native, worktree)
                return BuildResult("python", True, f"{decision.reason}, {len(files)} files reused", None, env)
            result = self._run(decision, worktree, sha, log_dir, env)
            if result.ok or decision.strategy == "source" or self.settings.strategy == "precompiled":
                return result
            remove_outputs(worktree)  # the wheel failed: compile instead
            fallback = self._run(self.decide(sha, worktree, "source"), worktree, sha, log_dir, env)
            return BuildResult(fallback.strategy, fallback.ok, f"{fallback.reason} (after wheel failed: "
                               f"{result.reason})", fallback.log_path, env)

    def _run(self, decision: Decision, worktree: Path, sha: str, log_dir: Path, env: dict) -> BuildResult:
        if decision.strategy == "source":
            clean_ignored(worktree)  # an earlier commit's build dir may hold stale objects and modules
        log_path = None
        for n, command in enumerate(decision.commands, 1):
            log_path = Path(log_dir) / f"build-{sha[:12]}-{decision.native[:12]}-{n}-{command.label}.log"
            result = run_process(list(command.argv), worktree, log_path, env=command.env)
            if result.returncode != 0:
                if decision.strategy == "source":
                    self.cache.fail(decision.native, "source", str(log_path))
                return BuildResult(decision.strategy, False,
                                   f"{command.label} exited {result.returncode} ({decision.reason})",
                                   str(log_path))
        files = built_outputs(worktree)
        self.cache.save(decision.native, worktree, files, decision.strategy, str(log_path))
        return BuildResult(decision.strategy, True, f"{decision.reason}, {len(files)} files stored",
                           str(log_path), env)


def built_outputs(worktree: Path) -> list[str]:
    """Extension modules in the tree, outside the build/ scratch dir (kept for incremental builds)."""
    return [rel for rel in untracked_files(worktree, EXTENSION_PATTERN) if not rel.startswith("build/")]


def remove_outputs(worktree: Path) -> None:
    """Delete extension modules a previous step left (ignored files survive `git clean`)."""
    for rel in built_outputs(worktree):
        (worktree / rel).unlink()
