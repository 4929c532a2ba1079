"""The environment a step runs in: the user's interpreter (`--env shared`), or per commit an overlay
virtual environment over it holding that commit's own runtime requirements (`--env per-commit`).

An overlay is created with uv (`uv venv --system-site-packages`, `uv pip install`) from
requirements/common.txt plus the platform file (rocm.txt, cuda.txt when the base torch is a CUDA build),
following `-r` includes, with the torch family removed as vLLM's use_existing_torch.py does and excluded
from resolution, so the base's accelerator build of torch is the one every step imports. Environments are
keyed by the normalised requirement set and the base's fingerprint, shared by every commit with the same
set, stored under <state dir>/envs/<key>/ and capped by count (least recently used removed). One process
creates a key at a time (an exclusive file lock); steps using an environment hold a shared lock on it, so
eviction never removes one in use. The base interpreter is never written to.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Protocol, Sequence, runtime_checkable

from bisector.errors import UsageError
from bisector.machine import cachedir
from bisector.machine.probe_env import last_error_line, python_environment, run_probe
from bisector.seams import DEFAULT_PYTHON

MODES = ("shared", "per-commit")
DEFAULT_ENV_CACHE_SIZE = 8
# Distributions that must come from the base interpreter, never from an overlay.
TORCH_FAMILY = ("torch", "torchvision", "torchaudio", "torchcodec", "triton", "pytorch-triton-rocm")
# The runtime requirement files: requirements/ from 0.5.5, requirements-*.txt at the top before.
COMMON_FILES = ("requirements/common.txt", "requirements-common.txt")
PLATFORM_FILES = {"rocm": ("requirements/rocm.txt", "requirements-rocm.txt"),
                  "cuda": ("requirements/cuda.txt", "requirements-cuda.txt")}
DEFAULT_VERSIONS = ("torch", "transformers")
UNRESOLVABLE_MARKERS = ("No solution found", "unsatisfiable", "not found in the package registry",
                        "no version of", "Because ")
# uv's words for a package index it could not reach: the machine's network, whatever the resolver then says
# (never remembered: the next step tries again)
NETWORK_MARKERS = ("error sending request", "dns error", "failed to lookup address", "Connection refused",
                   "Network is unreachable", "Temporary failure in name resolution", "tcp connect error",
                   "Connection reset", "operation timed out", "Request failed after")
ENV_FILE = "env.json"

Reader = Callable[[str], "str | None"]  # repository-relative path -> text, None when absent


@dataclass(frozen=True)
class RequirementSet:
    """A commit's normalised runtime requirements, and what was dropped as torch family."""

    requirements: tuple[str, ...]
    dropped: tuple[str, ...]
    files: tuple[str, ...]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_torch_family(name: str) -> bool:
    """use_existing_torch.py drops every torch* requirement; triton builds belong to torch as well."""
    canonical = _canonical(name)
    return "torch" in canonical or canonical in TORCH_FAMILY


def normalise(line: str) -> str | None:
    """One requirement line without comment, name canonical, spaces out of the specifier; None if blank."""
    text = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
    if not text:
        return None
    if text.startswith("-"):
        return " ".join(text.split())
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", text)
    if not match:
        return " ".join(text.split())
    spec, _, marker = text[match.end():].partition(";")
    spec = re.sub(r"\[([^\]]*)\]", lambda m: "[" + ",".join(sorted(
        _canonical(extra.strip()) for extra in m.group(1).split(","))) + "]", "".join(spec.split()))
    marker = " ".join(marker.replace('"', "'").split())
    return _canonical(match.group(0)) + spec + (f"; {marker}" if marker else "")


def requirement_set(read: Reader, platform: str) -> RequirementSet:
    """The runtime requirements of the tree `read` sees: common + platform file, `-r` followed."""
    starts = [next((path for path in candidates if read(path) is not None), None)
              for candidates in (COMMON_FILES, PLATFORM_FILES[platform])]
    seen: list[str] = []
    kept: set[str] = set()
    dropped: set[str] = set()

    def follow(path: str) -> None:
        if path in seen:
            return
        text = read(path)
        if text is None:
            raise ValueError(f"{path} is included but absent")
        seen.append(path)
        for raw in text.splitlines():
            line = normalise(raw)
            if line is None:
                continue
            include = re.match(r"(?:-r|--requirement)[\s=]+(\S+)$", line)
            if include:
                follow(posixpath.normpath(posixpath.join(posixpath.dirname(path), include.group(1))))
            elif not line.startswith("-") and is_torch_family(re.split(r"[^a-z0-9-]", line, maxsplit=1)[0]):
                dropped.add(line)
            else:
                kept.add(line)

    for start in filter(None, starts):
        follow(start)
    if not seen:
        raise ValueError(f"no runtime requirement file ({' or '.join(COMMON_FILES)})")
    return RequirementSet(tuple(sorted(kept)), tuple(sorted(dropped)), tuple(seen))


def base_fingerprint(python: str) -> dict:
    """The base interpreter's identity: path, prefix, version, torch family versions, HIP/CUDA version."""
    try:
        found = run_probe(python, TORCH_FAMILY)
    except OSError as exc:
        raise UsageError(f"--python {python}: {exc.strerror}") from None
    except subprocess.CalledProcessError as exc:
        raise UsageError(f"--python {python} failed: {last_error_line(exc, '?')}") from None
    torch = found["torch"]
    return {"executable": found["executable"], "prefix": found["prefix"], "version": found["python"],
            "family": {name: version for name, version in found["versions"].items() if version is not None},
            "hip": torch["hip"], "cuda": torch["cuda"], "torch_origin": torch["origin"], "sites": found["sites"]}


def torch_origin(python: str) -> str:
    """Where python imports torch from ("" when it has none, or cannot say)."""
    try:
        return run_probe(python)["torch"]["origin"] or ""
    except (subprocess.SubprocessError, ValueError):
        return ""


def platform_of(base: dict) -> str:
    """rocm unless the base torch is a CUDA build: the platform file an overlay takes."""
    return "cuda" if base.get("cuda") and not base.get("hip") else "rocm"


def environment_key(requirements: RequirementSet, base: dict) -> str:
    identity = {key: base.get(key) for key in ("executable", "prefix", "version", "family", "hip", "cuda")}
    blob = json.dumps({"requirements": list(requirements.requirements), "base": identity}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def uv_binary() -> str:
    """uv from its Python package (a dependency), else from PATH; UsageError when neither has it."""
    try:
        import uv
        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise UsageError("--env per-commit needs uv >= 0.10: pip install uv (a bisector dependency)")


@dataclass
class Environment:
    """Where one step runs: its python, the key of its environment (None: shared), and if it failed."""

    python: str  # "" in a shared environment: the judge's --python
    key: str | None = None
    ok: bool = True
    reason: str = ""
    created: bool = False
    requirements: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    path: Path | None = None
    machine_failure: bool = False  # failed for the machine (no network, uv itself), not the requirement set

    @property
    def installer(self) -> tuple[str, ...]:
        """The command that installs requirement files into this environment (builds' own needs), torch
        family excluded; () in a shared environment (the build uses pip there)."""
        if self.path is None:
            return ()
        return (uv_binary(), "pip", "install", "--python", self.python, "--excludes", str(self.path / "excludes.txt"))

    @property
    def env(self) -> dict[str, str]:
        """Variables that make the environment the one a step's commands find first."""
        if self.path is None:
            return {}
        bin_dir = self.path / "venv" / "bin"
        return {"VIRTUAL_ENV": str(self.path / "venv"),
                "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}

    def as_dict(self) -> dict:
        return {"key": self.key, "python": self.python, "created": self.created,
                "requirements": list(self.requirements), "dropped": list(self.dropped)}


@dataclass(frozen=True)
class EnvSettings:
    """What the user asked for (--env, --python, --env-cache-size); `open` binds it to a state dir."""

    mode: str = "shared"
    python: str = DEFAULT_PYTHON
    cache_size: int = DEFAULT_ENV_CACHE_SIZE

    def open(self, state_dir: Path) -> "SharedEnv | EnvStore":
        if self.mode not in MODES:
            raise UsageError(f"unknown --env {self.mode!r} (one of {', '.join(MODES)})")
        if self.mode == "shared":
            return SharedEnv(self)
        return EnvStore(self, Path(state_dir) / "envs")


class _Opened:
    """An opened environment provider: pickled (into a Ray task) as its settings, reopened on the node."""

    settings: EnvSettings

    def open(self, state_dir: Path) -> "SharedEnv | EnvStore":
        return self.settings.open(state_dir)

    def __reduce__(self):
        return EnvSettings, (self.settings.mode, self.settings.python, self.settings.cache_size)


class SharedEnv(_Opened):
    """Every step runs in --python itself."""

    def __init__(self, settings: EnvSettings = EnvSettings()):
        self.settings = settings

    @contextlib.contextmanager
    def environment(self, read: Reader) -> Iterator[Environment]:
        yield Environment("")  # the judge's own --python

    def versions(self, environment: Environment, names) -> dict:
        return {}


class EnvStore(_Opened):
    """Overlay environments under root/<key>/ (venv/, requirements.txt, create.log, env.json)."""

    def __init__(self, settings: EnvSettings, root: Path):
        self.settings, self.root = settings, Path(root)
        self.uv = uv_binary()
        self._base: dict | None = None
        self.lock = threading.Lock()

    @property
    def base(self) -> dict:
        with self.lock:
            if self._base is None:
                self._base = base_fingerprint(self.settings.python)
            return self._base

    def requirements(self, read: Reader) -> RequirementSet:
        return requirement_set(read, platform_of(self.base))

    @contextlib.contextmanager
    def environment(self, read: Reader) -> Iterator[Environment]:
        """The commit's environment, created if new; in use (not evictable) until the block ends.

        Steps share a stored environment under shared locks; a missing one is created under the key's
        exclusive lock, for which the others wait.
        """
        try:
            wanted = self.requirements(read)
        except (ValueError, OSError) as exc:
            yield Environment(self.settings.python, ok=False, reason=f"environment unresolvable: {exc}")
            return
        key = environment_key(wanted, self.base)
        with cachedir.lock_file(self._lock(key)) as handle:
            cachedir.take(handle, cachedir.SHARED)
            environment = self._stored(key, wanted)
            if environment is None:
                cachedir.take(handle, cachedir.EXCLUSIVE)
                environment = self._stored(key, wanted) or self._create(key, wanted)
                cachedir.take(handle, cachedir.SHARED)
                if environment.created:
                    self._evict(keep=key)
            yield environment

    def create(self, read: Reader) -> Environment:
        """The environment for one tree, created if missing (`bisector env create`)."""
        with self.environment(read) as environment:
            return environment

    def list(self) -> list[dict]:
        """Stored environments, most recently used first."""
        entries = []
        for meta in self.root.glob(f"*/{ENV_FILE}"):
            record = json.loads(meta.read_text())
            record["last_used"] = cachedir.used_at(meta.parent)
            entries.append(record)
        return sorted(entries, key=lambda record: -record["last_used"])

    def remove(self, key: str) -> bool:
        """Delete one environment unless a step is using it; False when there is no such key."""
        if not re.fullmatch(r"[0-9a-f]{16}", key) or not (self.root / key).exists():
            return False
        with cachedir.locked(self._lock(key), cachedir.EXCLUSIVE, wait=False) as handle:
            if handle is None:
                raise UsageError(f"environment {key} is in use")
            shutil.rmtree(self.root / key)
        return True

    def versions(self, environment: Environment, names) -> dict:
        """Installed versions of names as the environment's python sees them (remembered per key)."""
        found = python_environment(environment.python, tuple(names))
        return {name: found.get(name) for name in names}

    def _lock(self, key: str) -> Path:
        """The lock file of key's environment: shared while a step uses it, exclusive to create or remove it."""
        return self.root / ".locks" / f"{key}.lock"

    def _stored(self, key: str, wanted: RequirementSet) -> Environment | None:
        """The stored environment of key (or its remembered failure), marked used; None when there is none."""
        meta = self.root / key / ENV_FILE
        if not meta.is_file():
            return None
        cachedir.mark_used(self.root / key)
        return self._environment(key, wanted, json.loads(meta.read_text()), created=False)

    def _create(self, key: str, wanted: RequirementSet) -> Environment:
        """Under the key's exclusive lock: a new environment, or its failure (remembered if the set's)."""
        home = self.root / key
        shutil.rmtree(home, ignore_errors=True)  # a creation that did not finish
        home.mkdir(parents=True)
        record = self._build(home, wanted)
        (home / ENV_FILE).write_text(json.dumps(record, indent=2) + "\n")
        (home / "used").touch()
        if record["status"] == "failed" and not record.get("remember"):
            shutil.rmtree(home)  # not the requirement set's fault (e.g. no network): try again next time
        return self._environment(key, wanted, record, created=record["status"] == "ok")

    def _environment(self, key: str, wanted: RequirementSet, record: dict, created: bool) -> Environment:
        home = self.root / key
        ok = record["status"] == "ok"
        return Environment(str(home / "venv" / "bin" / "python") if ok else self.settings.python, key, ok,
                           record.get("reason", ""), created, wanted.requirements, wanted.dropped,
                           home if ok else None, machine_failure=not ok and not record.get("remember"))

    def _build(self, home: Path, wanted: RequirementSet) -> dict:
        """uv venv over the base, the base's site dirs after the overlay's, uv pip install; torch checked."""
        base = self.base
        record = {"key": home.name, "status": "failed", "requirements": list(wanted.requirements),
                  "dropped": list(wanted.dropped), "files": list(wanted.files), "base": base,
                  "created_at": time.time()}
        (home / "requirements.txt").write_text("".join(f"{line}\n" for line in wanted.requirements))
        (home / "excludes.txt").write_text("".join(f"{name}\n" for name in TORCH_FAMILY))
        log = home / "create.log"
        venv, python = home / "venv", home / "venv" / "bin" / "python"
        start = time.monotonic()
        steps = [[self.uv, "venv", "--quiet", "--system-site-packages", "--python", self.settings.python,
                  str(venv)],
                 [self.uv, "pip", "install", "--python", str(python), "-r", str(home / "requirements.txt"),
                  "--excludes", str(home / "excludes.txt")]]
        with open(log, "w") as out:
            for n, argv in enumerate(steps):
                out.write(f"$ {shlex.join(argv)}\n")
                out.flush()
                result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, text=True)
                if result.returncode != 0:
                    return {**record, **self._failure(log, argv)}
                if n == 0:
                    _see_base_sites(python, base["sites"])
        origin = torch_origin(str(python))
        if origin != (base["torch_origin"] or ""):
            return {**record, "reason": f"environment imports torch from {origin or 'nowhere'}, "
                                        f"not the base's {base['torch_origin']}"}
        return {**record, "status": "ok", "reason": "", "seconds": round(time.monotonic() - start, 3)}

    @staticmethod
    def _failure(log: Path, argv: Sequence[str]) -> dict:
        text = log.read_text(errors="replace")
        lines = [line.strip() for line in text.splitlines()[1:] if line.strip() and not line.startswith("$")]
        detail = " ".join(lines[-6:])[-400:]
        network = any(marker in text for marker in NETWORK_MARKERS)
        unresolvable = not network and any(marker in text for marker in UNRESOLVABLE_MARKERS)
        what = "environment unresolvable" if unresolvable else \
            f"environment creation failed ({argv[1]}{': the network' if network else ''})"
        return {"reason": f"{what}: {detail}", "remember": unresolvable}

    def _evict(self, keep: str) -> None:
        """Remove the least recently used environments beyond the cap; never one in use."""
        ready = [meta.parent for meta in self.root.glob(f"*/{ENV_FILE}")
                 if json.loads(meta.read_text())["status"] == "ok"]
        cachedir.evict(ready, self.settings.cache_size, used=cachedir.used_at,
                       remove=lambda home: home.name != keep and cachedir.remove_unless_locked(
                           home, self._lock(home.name)))


def _see_base_sites(python: Path, sites: list[str]) -> None:
    """Make the base's site dirs (a venv's too, which --system-site-packages misses) follow the overlay's."""
    purelib = run_probe(str(python))["purelib"]
    lines = "".join(f"import site; site.addsitedir({site!r})\n" for site in sites)
    (Path(purelib) / "_bisector_base.pth").write_text(lines)


def worktree_reader(worktree: Path) -> Reader:
    def read(path: str) -> str | None:
        file = Path(worktree) / path
        return file.read_text(errors="replace") if file.is_file() else None
    return read


@runtime_checkable
class Environments(Protocol):
    """Where each commit runs (`--env`), opened on a state dir: a step holds its environment while it runs."""

    settings: Any  # bisector.machine.envs.EnvSettings: what reopens it elsewhere (a Ray node)

    def environment(self, read: Reader) -> ContextManager[Environment]: ...

    def versions(self, environment: Environment, names: Sequence[str]) -> dict: ...

    def open(self, state_dir: Path) -> Environments: ...
