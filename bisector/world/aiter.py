"""AITER installed per commit (`--aiter pinned`), built the way vLLM's docker/Dockerfile.rocm_base builds it.

Given an AITER ref (the one a vLLM commit pins, or any ref asked for: the hunt inside AITER calls `plan` with
its own), the source comes from a bare clone kept under <state dir>/aiter/clones/ (fetched when a ref is
missing), checked out with its submodules, its requirements installed, and a wheel built with
`python3 setup.py bdist_wheel` (GPU_ARCHS=<arch>, PREBUILD_KERNELS=0: JIT mode, kernels compiled at first
use; `--aiter-prebuild` builds them ahead as vLLM's images do). The wheel is kept per build key — AITER
commit, arch, torch, Python (and prebuild) — under aiter/builds/<key>/; a failed build is remembered there
with its log, so a step needing it is skipped at once. Each step gets a thin layer over its environment
(`uv venv --system-site-packages` over the step's python, the base's site dirs after the layer's) holding
AITER's requirements and the wheel, under aiter/layers/<layer key>/. Builds and layers are each capped by
count (least recently used removed, never one in use). The base interpreter is never written to.

Inside a vLLM image (a level inside AITER with `--image`) the same source is checked out here and built and
installed inside a container of the held commit's image (IMAGE_SCRIPT, its python3, its torch and ROCm):
`AiterImageBuild` is that install, keyed by AITER commit + image digest + arch (+ prebuild); bisector.world.containers
commits the container into the tool's own image (bisector.world.images) and remembers a failed build here, under
aiter/images/<key>/.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple

from bisector.builds.version import PRETEND_ANY, pretend_env, release_version
from bisector.machine import cachedir
from bisector.machine.envs import TORCH_FAMILY, Environment, _see_base_sites, uv_binary
from bisector.machine.probe_env import run_probe
from bisector.process import run_process
from bisector.repo.pins import unsafe_git_source

DEFAULT_AITER_CACHE_SIZE = 4
RECORD = "record.json"
# vLLM's Dockerfile.rocm_base installs pyyaml beside AITER's requirements before it builds the wheel.
BUILD_EXTRAS = ("pyyaml",)


class Command(NamedTuple):
    """One command of an install (as bisector.builds.base.Command: a label, the argv, its variables)."""

    label: str
    argv: tuple[str, ...]
    env: dict


class AiterUnavailable(Exception):
    """The AITER source or ref cannot be had (clone or fetch failed, unknown ref): the step is skipped."""


@dataclass(frozen=True)
class AiterSettings:
    """--aiter-cache-size, --aiter-prebuild, --aiter-repo, and the arch (--rocm-arch)."""

    cache_size: int = DEFAULT_AITER_CACHE_SIZE
    prebuild: bool = False
    repo: str | None = None  # clone from here instead of the pin's AITER_REPO (a mirror, a local clone)
    arch: str | None = None  # GPU_ARCHS; None: PYTORCH_ROCM_ARCH, the GPUs', else gfx942


@dataclass(frozen=True)
class AiterBuild:
    """One AITER install, planned: which commit, for which arch, torch and Python, and its commands."""

    ref: str
    repo: str
    commit: str
    arch: str
    torch: str
    python: str
    prebuild: bool
    commands: tuple[Command, ...] = ()

    @property
    def key(self) -> str:
        """What the built wheel depends on: AITER commit + arch + torch + Python (+ prebuilt kernels)."""
        blob = json.dumps([self.commit, self.arch, self.torch, self.python, self.prebuild])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        mode = "prebuilt kernels" if self.prebuild else "JIT"
        named = f"{self.ref} ({self.commit[:10]})" if not self.commit.startswith(self.ref) else self.commit[:10]
        return (f"AITER {named} for {self.arch}, torch {self.torch}, Python {self.python}, "
                f"{mode}: key {self.key}")

    def to_json(self) -> dict:
        return {"ref": self.ref, "repo": self.repo, "commit": self.commit, "arch": self.arch, "torch": self.torch,
                "python": self.python, "prebuild": self.prebuild, "key": self.key}


@dataclass(frozen=True)
class AiterImageBuild:
    """AITER commit built and installed inside an image (base: its digest), for arch."""

    ref: str
    repo: str
    commit: str
    arch: str
    prebuild: bool
    base: str

    @property
    def key(self) -> str:
        """What the layered image depends on: AITER commit + base image digest + arch (+ prebuilt kernels)."""
        blob = json.dumps([self.commit, self.base, self.arch, self.prebuild])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        mode = "prebuilt kernels" if self.prebuild else "JIT"
        return f"AITER {self.commit[:10]} for {self.arch}, {mode}, over image {self.base[:19]}: key {self.key}"

    def to_json(self) -> dict:
        return {"ref": self.ref, "repo": self.repo, "commit": self.commit, "arch": self.arch,
                "prebuild": self.prebuild, "base": self.base, "key": self.key}


# Run by the image's /bin/sh with the source folder ($1, mounted read-only): vLLM's Dockerfile.rocm_base AITER
# stage in the image's python3 (AITER's requirements, torch family dropped, and pyyaml; the wheel; the wheel
# installed over the image's own AITER), built in a copy that is removed after.
IMAGE_REQUIREMENTS = "bisector-requirements.txt"
IMAGE_SCRIPT = f"""set -e
work=$(mktemp -d)
cp -R "$1"/. "$work"
cd "$work"
python3 -m pip install -r {IMAGE_REQUIREMENTS} {' '.join(BUILD_EXTRAS)}
python3 setup.py bdist_wheel --dist-dir="$work/dist"
python3 -m pip install --no-deps --force-reinstall "$work"/dist/*.whl
cd /
rm -rf "$work"
"""


@dataclass
class AiterLayer:
    """A step's AITER: the environment holding it, or why there is none (and the log that says so)."""

    ok: bool
    reason: str
    build: AiterBuild | None = None
    environment: Environment | None = None
    log_path: str | None = None
    built: bool = False  # the wheel was built by this step (not found in the cache)
    details: dict = field(default_factory=dict)


class AiterInstalls:
    """Clones, built wheels and layers under root (<state dir>/aiter)."""

    def __init__(self, settings: AiterSettings, root: Path):
        self.settings, self.root = settings, Path(root)
        self.lock = threading.Lock()
        self.fetched: dict[str, Path] = {}

    # -- source --------------------------------------------------------------------------------------------
    def clone(self, repo: str) -> Path:
        """The bare clone of repo kept under clones/, made once (one process at a time)."""
        name = hashlib.sha256(repo.encode()).hexdigest()[:16]
        target = self.root / "clones" / f"{name}.git"
        with self.lock:
            if repo in self.fetched:
                return self.fetched[repo]
            problem = unsafe_git_source(repo)
            if problem:
                raise AiterUnavailable(f"not cloning AITER from {repo!r}: {problem}")
            with cachedir.locked(self.root / ".locks" / f"clone-{name}.lock", cachedir.EXCLUSIVE):
                if not (target / "HEAD").is_file():
                    shutil.rmtree(target, ignore_errors=True)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    done = _git(None, "clone", "--bare", "--quiet", "--", repo, str(target))
                    if done.returncode != 0:
                        shutil.rmtree(target, ignore_errors=True)
                        raise AiterUnavailable(f"cannot clone AITER from {repo}: {_last(done.stderr)}")
            self.fetched[repo] = target
            return target

    def resolve(self, repo: str, ref: str) -> str:
        """The commit ref names in repo's clone, fetching once when the clone lacks it."""
        clone = self.clone(repo)
        for attempt in range(2):
            done = _git(clone, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
            if done.returncode == 0:
                return done.stdout.strip()
            if attempt == 0:
                _git(clone, "fetch", "--quiet", "--tags", "origin", "+refs/heads/*:refs/heads/*")
        raise AiterUnavailable(f"AITER ref {ref} not found in {repo}")

    # -- planning ------------------------------------------------------------------------------------------
    def plan(self, ref: str, repo: str, python: str) -> AiterBuild:
        """The install of AITER ref (from repo, or --aiter-repo) into an environment over python."""
        source = self.settings.repo or repo
        commit = self.resolve(source, ref)
        found = _probe(python)
        torch = found["versions"]["torch"] or "none"
        version = ".".join(found["python"].split(".")[:2])
        build = AiterBuild(ref, source, commit, self._arch(), torch, version, self.settings.prebuild)
        home, layer = self.root / "builds" / build.key, self.root / "layers" / "<layer key>"
        return AiterBuild(**{**build.__dict__, "commands": self._commands(build, home / "src", layer, home)})

    def reuse_commands(self, build: AiterBuild) -> tuple[Command, ...]:
        """What installs a stored wheel of build into a new layer: AITER's requirements, then the wheel."""
        home = self.root / "builds" / build.key
        commands = self._commands(build, home / "src", self.root / "layers" / "<layer key>", home,
                                  home / "requirements.txt")
        return commands[3], commands[5]

    def plan_image(self, ref: str, repo: str, base: str) -> AiterImageBuild:
        """The install of AITER ref (from repo, or --aiter-repo) inside the image whose digest is base."""
        source = self.settings.repo or repo
        return AiterImageBuild(ref, source, self.resolve(source, ref), self._arch(), self.settings.prebuild, base)

    def image_source(self, build: AiterImageBuild, log_dir: Path, label: str) -> tuple[Path | None, str, str | None]:
        """The commit checked out with its submodules under images/<key>/src, AITER's requirements beside it
        without the torch family (IMAGE_REQUIREMENTS): (the folder, "", log), or (None, why not, its log)."""
        home = self.root / "images" / build.key
        src = home / "src"
        shutil.rmtree(src, ignore_errors=True)
        src.parent.mkdir(parents=True, exist_ok=True)
        commands = self._commands(build, src, home, home)[:3]
        log = None
        for n, command in enumerate(commands, 1):
            log = Path(log_dir) / f"build-{label}-{build.key[:12]}-{n}-{command.label}.log"
            try:
                done = run_process(list(command.argv), home, log, env=command.env)
            except OSError as exc:
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(f"cannot start {command.argv[0]}: {exc.strerror}\n")
                done = None
            if done is None or done.returncode != 0:
                shutil.rmtree(src, ignore_errors=True)
                return None, f"{command.label} failed ({_tail(str(log))})", str(log)
        wanted = (src / "requirements.txt").read_text().splitlines() if (src / "requirements.txt").is_file() else []
        kept = [line for line in wanted if _requirement_name(line) not in TORCH_FAMILY]
        (src / IMAGE_REQUIREMENTS).write_text("".join(f"{line}\n" for line in kept))
        return src, "", str(log) if log else None

    def image_failure(self, build: AiterImageBuild) -> dict | None:
        """The remembered failure of this image build ({"reason", "log"}), None when it never failed."""
        record = _read(self.root / "images" / build.key / RECORD)
        return record if record and record.get("status") == "failed" else None

    def remember_image(self, build: AiterImageBuild, status: str, **record) -> None:
        """Record the image build's outcome (status ok or failed) under images/<key>/."""
        _write(self.root / "images" / build.key / RECORD, {**build.to_json(), "status": status, **record,
                                                            "at": time.time()})

    def _arch(self) -> str:
        from bisector.builds.native import DEFAULT_ARCH, gpu_arch
        return self.settings.arch or os.environ.get("PYTORCH_ROCM_ARCH") or gpu_arch() or DEFAULT_ARCH

    def wheel_env(self, build: AiterBuild | AiterImageBuild) -> dict:
        """The wheel build's variables (here, or inside an image): GPU_ARCHS, PREBUILD_KERNELS and its version,
        from AITER's release tags (never from a tag of whoever's clone --aiter-repo is)."""
        clone = self._clone_path(build.repo)
        return {"GPU_ARCHS": build.arch, "PREBUILD_KERNELS": "1" if build.prebuild else "0",
                **pretend_env(release_version(functools.partial(_git_output, clone), build.commit), (PRETEND_ANY,))}

    def _clone_path(self, repo: str) -> Path:
        return self.root / "clones" / f"{hashlib.sha256(repo.encode()).hexdigest()[:16]}.git"

    def _commands(self, build: AiterBuild | AiterImageBuild, src: Path, layer: Path, home: Path,
                  requirements: Path | None = None) -> tuple[Command, ...]:
        """vLLM's Dockerfile.rocm_base AITER stage, into the layer's python: check out the commit with its
        submodules, install its requirements (torch family excluded) and pyyaml, build the wheel, install it.
        requirements: AITER's requirements file (default: the checkout's)."""
        python = str(layer / "venv" / "bin" / "python")
        install = (uv_binary(), "pip", "install", "--python", python, "--excludes", str(layer / "excludes.txt"))
        clone = self._clone_path(build.repo)
        env = self.wheel_env(build)
        return (Command("aiter-checkout", ("git", "clone", "--quiet", "--no-checkout", str(clone), str(src)), {}),
                Command("aiter-switch", ("git", "-C", str(src), "checkout", "--quiet", "--detach", build.commit), {}),
                Command("aiter-submodules", ("git", "-C", str(src), "submodule", "update", "--init", "--recursive"),
                        {}),
                Command("aiter-requirements", (*install, "-r", str(requirements or src / "requirements.txt"),
                                               *BUILD_EXTRAS), {}),
                Command("aiter-wheel", (python, "setup.py", "bdist_wheel", f"--dist-dir={home / 'dist'}"), env),
                Command("aiter-install", (*install, "--no-deps", str(home / "dist" / "*.whl")), {}))

    # -- installing ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def installed(self, build: AiterBuild, base: str, log_dir: Path, label: str) -> Iterator[AiterLayer]:
        """A layer over python `base` holding AITER as planned, created if new (the wheel built once per build
        key); in use (not evictable) until the block ends. Failures of the build are remembered."""
        key = hashlib.sha256(json.dumps([build.key, base]).encode()).hexdigest()[:16]
        home = self.root / "layers" / key
        with cachedir.lock_file(self.root / ".locks" / f"layer-{key}.lock") as handle:
            cachedir.take(handle, cachedir.SHARED)
            layer = self._stored_layer(home, build)
            if layer is None:
                cachedir.take(handle, cachedir.EXCLUSIVE)
                layer = self._stored_layer(home, build) or self._create(home, build, base, log_dir, label)
                cachedir.take(handle, cachedir.SHARED)
                if layer.ok:
                    self._evict("layers", keep=key)
            yield layer

    def failure(self, build: AiterBuild) -> dict | None:
        """The remembered failure of this build key ({"reason", "log"}), None when it never failed."""
        record = _read(self.root / "builds" / build.key / RECORD)
        return record if record and record.get("status") == "failed" else None

    def _stored_layer(self, home: Path, build: AiterBuild) -> AiterLayer | None:
        record = _read(home / RECORD)
        if record and record.get("status") == "ok":
            cachedir.mark_used(home)
            return AiterLayer(True, f"{build.describe()}, installed before", build, self._environment(home),
                              record.get("log"), details={"aiter": {**build.to_json(), "layer": home.name}})
        failed = self.failure(build)
        if failed:
            return AiterLayer(False, f"{build.describe()} failed to install before: {failed['reason']}", build,
                              log_path=failed.get("log"), details={"aiter": build.to_json()})
        return None

    def _environment(self, home: Path) -> Environment:
        return Environment(str(home / "venv" / "bin" / "python"), home.name, path=home)

    def _create(self, home: Path, build: AiterBuild, base: str, log_dir: Path, label: str) -> AiterLayer:
        """Under the layer's exclusive lock: the layer venv, the wheel (built under the build key's lock if
        not stored), its requirements and the wheel installed."""
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        (home / "excludes.txt").write_text("".join(f"{name}\n" for name in TORCH_FAMILY))
        python = home / "venv" / "bin" / "python"
        build_home = self.root / "builds" / build.key
        commands = self._commands(build, build_home / "src", home, build_home)
        step = {command.label: command for command in commands}
        logs = Path(log_dir)
        n = 0

        def run(command: Command, cwd: Path) -> tuple[bool, str]:
            nonlocal n
            n += 1
            log = logs / f"build-{label}-{build.key[:12]}-{n}-{command.label}.log"
            argv = list(command.argv)
            if command.label == "aiter-install":
                argv[-1] = str(next((build_home / "dist").glob("*.whl"), build_home / "dist" / "missing.whl"))
            try:
                result = run_process(argv, cwd, log, env=command.env)
            except OSError as exc:
                log.write_text(f"cannot start {argv[0]}: {exc.strerror}\n")
                return False, str(log)
            return result.returncode == 0, str(log)

        venv = [uv_binary(), "venv", "--quiet", "--system-site-packages", "--python", base, str(home / "venv")]
        ok, log = run(Command("aiter-layer", tuple(venv), {}), home)
        if not ok:
            shutil.rmtree(home, ignore_errors=True)  # not the build's fault: tried again next time
            return AiterLayer(False, f"{build.describe()}: layer environment failed ({_tail(log)})", build,
                              log_path=log, details={"aiter": build.to_json()})
        _see_base_sites(python, _probe(base)["sites"])
        built = False
        with cachedir.locked(self.root / ".locks" / f"build-{build.key}.lock", cachedir.EXCLUSIVE):
            failed = self.failure(build)
            if failed:
                shutil.rmtree(home, ignore_errors=True)
                return AiterLayer(False, f"{build.describe()} failed to install before: {failed['reason']}", build,
                                  log_path=failed.get("log"), details={"aiter": build.to_json()})
            if not list((build_home / "dist").glob("*.whl")):
                shutil.rmtree(build_home, ignore_errors=True)
                build_home.mkdir(parents=True)
                start = time.monotonic()
                for label_ in ("aiter-checkout", "aiter-switch", "aiter-submodules", "aiter-requirements",
                               "aiter-wheel"):
                    cwd = build_home / "src" if label_ in ("aiter-requirements", "aiter-wheel") else build_home
                    ok, log = run(step[label_], cwd)
                    if not ok:
                        reason = f"{label_} failed ({_tail(log)})"
                        _write(build_home / RECORD, {**build.to_json(), "status": "failed", "reason": reason,
                                                     "log": log, "at": time.time()})
                        shutil.rmtree(build_home / "src", ignore_errors=True)
                        shutil.rmtree(home, ignore_errors=True)
                        return AiterLayer(False, f"{build.describe()}: {reason}", build, log_path=log,
                                          details={"aiter": build.to_json(), "aiter_failed": True})
                shutil.copy2(build_home / "src" / "requirements.txt", build_home / "requirements.txt")
                shutil.rmtree(build_home / "src", ignore_errors=True)
                _write(build_home / RECORD, {**build.to_json(), "status": "ok", "log": log,
                                             "seconds": round(time.monotonic() - start, 3), "at": time.time()})
                built = True
                self._evict("builds", keep=build.key)
            cachedir.mark_used(build_home)
        stored = self._commands(build, build_home / "src", home, build_home, build_home / "requirements.txt")
        for command in (() if built else (stored[3],)) + (step["aiter-install"],):
            ok, log = run(command, home)
            if not ok:
                shutil.rmtree(home, ignore_errors=True)
                return AiterLayer(False, f"{build.describe()}: {command.label} failed ({_tail(log)})", build,
                                  log_path=log, details={"aiter": build.to_json()})
        _write(home / RECORD, {**build.to_json(), "status": "ok", "base": base, "log": log, "at": time.time()})
        cachedir.mark_used(home)
        how = "built and installed" if built else "installed from the stored wheel"
        return AiterLayer(True, f"{build.describe()}, {how}", build, self._environment(home), log, built,
                          details={"aiter": {**build.to_json(), "layer": home.name}})

    def _evict(self, kind: str, keep: str) -> None:
        """Remove the least recently used layers (or builds) beyond the cap; never one in use."""
        stored = [meta.parent for meta in (self.root / kind).glob(f"*/{RECORD}")
                  if (_read(meta) or {}).get("status") == "ok"]
        prefix = "layer" if kind == "layers" else "build"
        cachedir.evict(stored, self.settings.cache_size, used=cachedir.used_at,
                       remove=lambda home: home.name != keep and cachedir.remove_unless_locked(
                           home, self.root / ".locks" / f"{prefix}-{home.name}.lock"))

    def list(self) -> list[dict]:
        """Stored builds (ok and failed), most recently used first."""
        entries = []
        for meta in (self.root / "builds").glob(f"*/{RECORD}"):
            record = _read(meta) or {}
            entries.append({**record, "last_used": cachedir.used_at(meta.parent)})
        return sorted(entries, key=lambda record: -record["last_used"])


def _requirement_name(line: str) -> str:
    """The distribution a requirements line names (lowercase, - for _), "" for a comment or an option."""
    text = line.split("#", 1)[0].strip()
    if not text or text.startswith("-"):
        return ""
    name = re.split(r"[\s<>=!~;\[@(]", text, maxsplit=1)[0]
    return name.lower().replace("_", "-")


def _probe(python: str) -> dict:
    try:
        return run_probe(python, ("torch",))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise AiterUnavailable(f"cannot run {python}: {exc}") from None


def _git_output(cwd: Path, *args: str) -> str | None:
    done = _git(cwd, *args)
    return done.stdout if done.returncode == 0 else None


def _git(cwd: Path | None, *args: str) -> subprocess.CompletedProcess:
    argv = ["git", *(["--git-dir", str(cwd)] if cwd else []), *args]
    return subprocess.run(argv, capture_output=True, text=True)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, record: Mapping) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(record, indent=2) + "\n")
    staging.replace(path)


def _last(text: str) -> str:
    return (text.strip().splitlines() or ["?"])[-1][:300]


def _tail(log: str) -> str:
    """The last meaningful line of a command's log."""
    try:
        lines = [line.strip() for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return (lines[-1] if lines else "no output")[:300] + f"; log {log}"
