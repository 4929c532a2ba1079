"""The tool's shared GPU caches on this node: vLLM's compile caches and the scenarios' model dirs.

Everything lives under one root, `$BISECTOR_CACHE_DIR` (default `$XDG_CACHE_HOME/bisector`, else
`~/.cache/bisector`):

- `compile/vllm`, `compile/triton`, `compile/inductor`: what a step gives vLLM as VLLM_CACHE_ROOT,
  TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR. vLLM keys its compile cache by content (config, model
  path, traced source), so every step, slot and run on the node shares it safely; vLLM, Triton and
  Inductor each write an entry to a temporary name and rename it into place.
- `models/<hash>/`: model dirs written once per content (`publish`), shared like the compile cache.
- `compile/warm/<key>`: marks that an engine of that configuration started here once (`first_start`): the
  first start compiles alone while the other slots' engines, their Python already loaded, wait at its lock
  (`<key>.lock`) until it has saved its compiled model or is up; then they all find its compiles cached.

Steps hold a shared lock on the root while they run; trimming to the size cap (least recently used
entry first) and `cache forget --compile` need it exclusively, so they never delete what a running step
reads. A Ray node keeps its own root.

The root is the tool's as a state dir is (`claim_root`, the `bisector-cache` marker): a folder already
holding files the tool did not make (a user's own `models/` on a big disk) is refused in one line, never
counted, trimmed or cleared; and clearing removes only the folders the tool writes (TOOL_FOLDERS).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

from bisector.machine.cachedir import EXCLUSIVE, SHARED, claim, evict, foreign, human_size, lock_file, locked, take

ROOT_ENV = "BISECTOR_CACHE_DIR"
SIZE_ENV = "BISECTOR_COMPILE_CACHE_SIZE"
DEFAULT_SIZE = 10 * 1024 ** 3
# Folders whose children are the unit of eviction (relative to the root).
CONTAINERS = ("compile/vllm/torch_compile_cache/torch_aot_compile", "compile/vllm/torch_compile_cache",
              "compile/vllm", "compile/triton", "compile/inductor", "models")
ROOT_MARKER = "bisector-cache"  # marks the root as the tool's (cachedir.claim)


class CacheBusy(RuntimeError):
    """A running step holds the cache."""


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    given = env.get(ROOT_ENV)
    if given:  # `~` expanded, a relative path taken from the current directory (once)
        return Path(os.path.abspath(os.path.expanduser(given)))
    base = env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache"
    return Path(base) / "bisector"


def _default_root(root: Path) -> bool:
    """Whether root is the default root (made unmarked by earlier versions: the tool's by its name)."""
    return root == cache_root({name: value for name, value in os.environ.items() if name != ROOT_ENV})


def claim_root(root: Path) -> None:
    """Mark root as the tool's cache root (made if missing), or raise UsageError in one line when it holds files
    the tool did not make."""
    claim(root, ROOT_MARKER, "cache dir", taken_over=_default_root,
          hint=f"point ${ROOT_ENV} at a new or empty directory")


def size_cap(env: Mapping[str, str] | None = None) -> int:
    """The cap in bytes from $BISECTOR_COMPILE_CACHE_SIZE ('20G', '512M'); ValueError when it is no size."""
    from bisector.builds import parse_size
    text = (os.environ if env is None else env).get(SIZE_ENV)
    return parse_size(text) if text else DEFAULT_SIZE


def compile_env(root: Path) -> dict[str, str]:
    """The environment that points vLLM, Triton and Inductor at root's compile caches."""
    base = root / "compile"
    return {"VLLM_CACHE_ROOT": str(base / "vllm"), "TRITON_CACHE_DIR": str(base / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor")}


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int
    used: float  # the newest mtime in it, or when a step last named it (touch)


def entries(root: Path) -> list[Entry]:
    """The evictable entries under root: the children of CONTAINERS that are no container themselves, and no
    symbolic link nor under one (`links`)."""
    containers = {root / rel for rel in CONTAINERS}
    found = []
    for container in containers:
        if not container.is_dir() or _first_link(root, container) is not None:
            continue
        for child in container.iterdir():
            if child in containers or child.name.startswith(".") or child.is_symlink():  # .tmp: being written
                continue
            size, used = _measure(child)
            found.append(Entry(child, size, used))
    return sorted(found, key=lambda entry: entry.used)


def links(root: Path) -> list[Path]:
    """The symbolic links among the tool's folders under root and their entries. The tool makes none: what one
    points at is somebody's files, so it is never followed, counted or removed, nor is the link."""
    folders = {root / rel for rel in (*CONTAINERS, *TOOL_FOLDERS)}
    found = set()
    for folder in folders:
        link = _first_link(root, folder)
        if link is not None:
            found.add(link)
        elif folder.is_dir():
            found.update(child for child in folder.iterdir() if child.is_symlink())
    return sorted(found)


def _first_link(root: Path, path: Path) -> Path | None:
    """The first symbolic link on the way from root down to path (path itself included), if any."""
    step = root
    for part in path.relative_to(root).parts:
        step = step / part
        if step.is_symlink():
            return step
    return None


def touch(root: Path, text: str) -> int:
    """Mark as just used every entry whose path text names (vLLM logs the cache dirs it reads)."""
    count = 0
    for entry in entries(root):
        if str(entry.path) in text:
            os.utime(entry.path)
            count += 1
    return count


def trim(root: Path, cap: int) -> list[Entry]:
    """Delete least recently used entries until the total is at most cap; the removed ones."""
    def remove(entry: Entry) -> bool:
        _remove(entry.path)
        return True

    return evict(entries(root), cap, remove, used=lambda entry: entry.used, size=lambda entry: entry.size)


@contextlib.contextmanager
def in_use(root: Path, cap: int) -> Iterator[list[Entry]]:
    """Hold root for one step: trim it to cap first when no other step holds it, then keep a shared
    lock until the step ends. Yields what trimming removed; UsageError when root is not the tool's."""
    claim_root(root)
    with lock_file(root / ".lock") as lock:
        removed = trim(root, cap) if take(lock, EXCLUSIVE, wait=False) else []  # else other steps run
        take(lock, SHARED)
        yield removed


WARM = "compile/warm"
# What the tool writes under the root (clear removes these, nothing else): the caches and the warm marks.
TOOL_FOLDERS = ("compile/vllm", "compile/triton", "compile/inductor", WARM, "models")
WAIT_POLL = 0.2  # seconds between looks for the first start's saved compile
# vLLM saves an engine's compiled model here last of its compiles (torch_aot_compile/<hash>/rank_<r>/model)
AOT_MODELS = "compile/vllm/torch_compile_cache/torch_aot_compile/*/rank_*/model"


def compiled_models(root: Path) -> set[Path]:
    """The compiled models vLLM has saved under root (AOT_MODELS)."""
    return set(root.glob(AOT_MODELS))


@dataclass(frozen=True)
class Start:
    """What first_start gives a step: `up`, to call once its engine is up; `gate`, when another start of the
    same configuration is compiling, the lock file its engine processes wait on after their imports and
    before they build the engine (scenarios/dpa_fp8_kv/child.py pass_start_gate), so their Python is loaded
    while the first start compiles."""
    up: Callable[[], None]
    gate: Path | None = None


@contextlib.contextmanager
def first_start(root: Path, key: str) -> Iterator[Start]:
    """Hold around an engine start of configuration key: the first on this node starts alone, and steps
    that start meanwhile (the other slots of a run) get a gate that holds their engines until its compiles
    are in the cache, so vLLM, Triton and Inductor compile once and the rest find it all cached; once key is
    marked warm nobody waits. The gate opens as soon as the first start saves a compiled model it did not
    find (vLLM does so when its compile is done, before it captures CUDA graphs), else when it calls `up`
    (the engine is up); leaving the block, however the start ended, opens it too, and a first start whose
    process died opens it with its lock. UsageError when root is not the tool's."""
    claim_root(root)
    marker = root / WARM / key
    if marker.exists():
        yield Start(lambda: None)
        return
    gate = root / WARM / f"{key}.lock"
    with lock_file(gate) as handle:
        if not take(handle, EXCLUSIVE, wait=False):  # another start compiles: this one's engines wait at the gate
            yield Start(lambda: None, gate)
            return
        released = threading.Lock()

        def up() -> None:
            with released:  # the watcher's thread or the step's
                marker.touch()
                fcntl.flock(handle, fcntl.LOCK_UN)

        if marker.exists():  # warmed meanwhile
            up()
            yield Start(lambda: None)
            return
        found_before, ended = compiled_models(root), threading.Event()

        def watch() -> None:
            while not ended.wait(WAIT_POLL):
                if compiled_models(root) - found_before:  # this start's compile is published
                    up()
                    return

        watcher = threading.Thread(target=watch, name=f"first-start-{key}", daemon=True)
        watcher.start()
        try:
            yield Start(up)
        finally:
            ended.set()
            watcher.join()
            up()


def clear(root: Path) -> tuple[int, int, list[Path]]:
    """Delete the compile caches and model dirs under root: (entries, bytes, the symbolic links left as they are
    with what they point at, `links`). CacheBusy while a step runs, UsageError when root is not the tool's."""
    if not root.is_dir():
        return 0, 0, []
    claim_root(root)
    with locked(root / ".lock", EXCLUSIVE, wait=False) as lock:
        if lock is None:
            raise CacheBusy(f"{root} is in use by a running step")
        found, left = entries(root), links(root)
        for entry in found:
            _remove(entry.path)
        for folder in (root / rel for rel in TOOL_FOLDERS):
            if not any(link == folder or folder in link.parents or link in folder.parents for link in left):
                shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            (root / "compile").rmdir()  # only when nothing else is left in it
        return len(found), sum(entry.size for entry in found), left


def describe(root: Path, cap: int) -> str:
    """One line: where the caches are, their size against the cap, how many entries."""
    if not root.is_dir():
        return f"compile cache: {root} (empty; cap {human_size(cap)})"
    try:
        others = foreign(root, ROOT_MARKER, _default_root)
    except OSError as exc:
        return f"compile cache: {root} not readable ({exc.strerror})"
    if others:
        return f"compile cache: {root} is not bisector's (it holds files bisector did not make, no {ROOT_MARKER} " \
               f"marker): nothing counted; point ${ROOT_ENV} at a new or empty directory"
    found, left = entries(root), links(root)
    models = sum(1 for entry in found if entry.path.parent == root / "models")
    unfollowed = f", {len(left)} symbolic links not followed" if left else ""
    return (f"compile cache: {root} ({human_size(sum(entry.size for entry in found))} of {human_size(cap)}, "
            f"{len(found) - models} compile entries, {models} model dirs{unfollowed})")


def publish(root: Path, name: str, fill) -> tuple[Path, bool]:
    """root/models/name, written once: fill(tmp_dir) writes the content into a fresh temporary dir beside
    it, which is then renamed into place (a concurrent writer's copy wins ties). (path, written here);
    UsageError when root is not the tool's."""
    claim_root(root)
    target = root / "models" / name
    if target.is_dir():
        return target, False
    tmp = root / "models" / ".tmp" / f"{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            return target, False
        return target, True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _measure(path: Path) -> tuple[int, float]:
    try:
        stat = path.lstat()
    except OSError:
        return 0, 0.0
    if not path.is_dir() or path.is_symlink():
        return stat.st_size, stat.st_mtime
    size, used = 0, stat.st_mtime
    for folder, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                item = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            used = max(used, item.st_mtime)
            if name in files:
                size += item.st_size
    return size, used


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

