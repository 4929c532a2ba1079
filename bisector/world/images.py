"""Per-commit container images: the runtime (docker, or podman), which commits have an image, pulling one,
proving it holds the commit under test, and the `run` argv with vLLM's AMD container flags.

vLLM's AMD CI builds and pushes `rocm/vllm-ci:<full sha>` for every commit its AMD pipeline tests: that
commit's vLLM built against its own ROCm, torch and pinned AITER. `--image 'rocm/vllm-ci:{commit}'` runs
each step in that image. Availability answers (`image inspect`, `manifest inspect`) are kept in the record
(table `images`; a missing image is asked again after MISS_TTL). Images this tool pulled are recorded and
removed least recently used beyond `--image-cache-size`; an image it did not pull is never removed.

`amd_gpu_flags` is the one implementation of the flags vLLM's AMD test runner gives its containers
(`/dev/kfd`, the agent's render devices, the numeric render group, video, `--ulimit core=0`, `--ipc=host`,
`--shm-size`); the CI launcher in examples/ci asks for them with `python -m bisector.world.images flags`.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from bisector.errors import UsageError
from bisector.machine.cachedir import evict, human_size
from bisector.machine.gpus import env_gpus
from bisector.process import GROUPS, Cancelled

RUNTIMES = ("docker", "podman")
PLACEHOLDERS = ("{commit}", "{short}")
FALLBACKS = ("skip", "build")
MISS_TTL = 3600.0  # seconds a "no such image" answer is kept before the registry is asked again
# A registry that stops sending: a runtime call (inspect, manifest inspect, image rm) that gives no answer in
# REGISTRY_SECONDS, or a pull that prints nothing for PULL_QUIET_SECONDS or the time its three largest layers
# take at PULL_MIN_RATE (docker and podman print no byte counts off a terminal), is given up as stalled;
# STALL_VARIABLE sets both bounds at once.
STALL_VARIABLE = "BISECTOR_IMAGE_STALL_SECONDS"
REGISTRY_SECONDS = 120.0
PULL_QUIET_SECONDS = 600.0
PULL_MIN_RATE = 5_000_000  # bytes per second
DEFAULT_IMAGE_CACHE_SIZE = "500G"  # --image-cache-size: images this tool pulled, kept at most
DEFAULT_SHM_SIZE = "16g"  # vLLM's AMD test runner's --shm-size
DEFAULT_NETWORK = "none"
IMAGE_PYTHON = "python3"  # the image's interpreter: steps run vLLM's own Python in the image
REVISION_LABEL = "org.opencontainers.image.revision"
# An image this tool made (an AITER commit layered over a held vLLM commit's image): named LAYER_REPOSITORY:<key>,
# labelled OWNER_LABEL=bisector, recorded as its own (removed least recently used, as the images it pulled).
LAYER_REPOSITORY = "bisector-aiter-layer"
OWNER_LABEL = "org.bisector.owner"
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
# Where a vLLM image keeps its checkout (vLLM's docker/Dockerfile.rocm copies the source there).
CHECKOUT_DIRS = ("/vllm-workspace", "/app/vllm", "/workspace/vllm")
RENDER_DEVICE_VARIABLES = ("BUILDKITE_AGENT_META_DATA_RENDER_DEVICES", "BISECTOR_RENDER_DEVICES")
_ABSENT = ("manifest unknown", "no such manifest", "not found", "does not exist", "no such image",
           "name unknown", "manifest_unknown")


class ImageError(Exception):
    """A container runtime call failed for a reason that is no answer about the image (network, auth)."""


class ImageStalled(ImageError):
    """A container runtime call gave no answer within its bound (a registry that stopped sending)."""


def stall_seconds(default: float) -> float:
    """How long a runtime call may go without an answer: STALL_VARIABLE when set (seconds), else default."""
    given = os.environ.get(STALL_VARIABLE, "").strip()
    try:
        seconds = float(given) if given else default
    except ValueError:
        raise UsageError(f"{STALL_VARIABLE}={given!r}: a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise UsageError(f"{STALL_VARIABLE}={given!r}: a number of seconds above 0")
    return seconds


def pull_quiet_seconds(info: "ImageInfo") -> float:
    """How long a pull of info may print nothing before it counts as stalled: its three largest layers (the
    downloads docker runs at once) at PULL_MIN_RATE, PULL_QUIET_SECONDS at least."""
    sizes = sorted((size for _, size in info.layers), reverse=True)[:3] or [info.size or 0]
    return stall_seconds(max(PULL_QUIET_SECONDS, sum(sizes) / PULL_MIN_RATE))


def check_template(template: str) -> str:
    """--image TEMPLATE, or UsageError: it must name the commit ({commit} or {short}) and be one image."""
    if not any(p in template for p in PLACEHOLDERS):
        raise UsageError(f"--image {template!r} names no commit: put {{commit}} (full sha) or {{short}} "
                         f"(12 hex) where the tag goes, e.g. 'rocm/vllm-ci:{{commit}}'")
    try:
        expanded = expand(template, "0" * 40)
    except (KeyError, IndexError, ValueError):
        raise UsageError(f"--image {template!r}: only {{commit}} and {{short}} may be filled in") from None
    if not re.fullmatch(r"[a-z0-9][a-z0-9._/:@-]*", expanded, re.IGNORECASE):
        raise UsageError(f"--image {template!r} is not an image reference")
    return template


def expand(template: str, sha: str) -> str:
    """The image of commit sha: {commit} the full sha, {short} its first 12 hex."""
    return template.format(commit=sha, short=sha[:12])


# -- the runtime -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageInfo:
    """What the runtime says of one image reference."""

    ref: str
    present: bool            # exists, here or in its registry
    local: bool = False      # already on this machine
    digest: str | None = None  # the manifest digest (sha256:…), else the image id
    image_id: str | None = None
    size: int | None = None  # bytes: the image's (local), or its layers' compressed sizes (registry)
    layers: tuple[tuple[str, int], ...] = ()  # (layer digest, compressed size) from the registry manifest
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"ref": self.ref, "present": self.present, "local": self.local, "digest": self.digest,
                "image_id": self.image_id, "size": self.size, "layers": [list(layer) for layer in self.layers],
                "labels": dict(self.labels)}

    @classmethod
    def from_json(cls, data: Mapping) -> "ImageInfo":
        return cls(data["ref"], data["present"], data.get("local", False), data.get("digest"),
                   data.get("image_id"), data.get("size"), tuple((d, s) for d, s in data.get("layers") or ()),
                   data.get("labels") or {})


@dataclass(frozen=True)
class Runtime:
    """A container runtime on PATH: docker (default) or podman (`--container-runtime podman`)."""

    name: str
    path: str

    @classmethod
    def find(cls, name: str = "docker") -> "Runtime":
        """The runtime by name, or UsageError naming what is missing."""
        if name not in RUNTIMES:
            raise UsageError(f"--container-runtime {name!r}: one of {', '.join(RUNTIMES)}")
        path = shutil.which(name)
        if path is None:
            other = next(r for r in RUNTIMES if r != name)
            raise UsageError(f"--image needs a container runtime: {name} is not on PATH "
                             f"(install it, or give --container-runtime {other})")
        return cls(name, path)

    def _call(self, *args: str, timeout: float | None = None, cancel: threading.Event | None = None,
              stoppable: bool = True) -> subprocess.CompletedProcess:
        """The runtime's answer to args; ImageError when it cannot start, ImageStalled when it gives none in
        timeout seconds (default: a registry's bound, stall_seconds), Cancelled on cancel or, when stoppable
        (not a cleanup, which must run as the driver stops), driver stop."""
        limit = stall_seconds(REGISTRY_SECONDS) if timeout is None else timeout
        try:
            proc = subprocess.Popen([self.path, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise ImageError(f"{self.name} {args[0]}: {exc}") from None
        deadline = time.monotonic() + limit
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    out, err = proc.communicate(timeout=0.05)
                    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
                if cancel is not None and cancel.is_set() or stoppable and GROUPS.stopping:
                    raise Cancelled()
                if time.monotonic() >= deadline:
                    what = " ".join(arg for arg in args[:2] if not arg.startswith("-"))
                    raise ImageStalled(f"{self.name} {what} gave no answer in {limit:g} s")
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()

    def version(self) -> str | None:
        """The client's version, None when it does not answer."""
        with contextlib.suppress(ImageError):
            found = re.search(r"version\s+v?([0-9][\w.+-]*)", self._call("--version", timeout=20).stdout)
            if found:
                return found.group(1).rstrip(",")
        return None

    def local(self, refs: Sequence[str], cancel: threading.Event | None = None) -> dict[str, ImageInfo]:
        """The refs present on this machine (one `image inspect` for them all)."""
        found: dict[str, ImageInfo] = {}
        for chunk in (refs[i:i + 200] for i in range(0, len(refs), 200)):
            done = self._call("image", "inspect", *chunk, cancel=cancel)
            try:
                entries = json.loads(done.stdout or "[]")
            except ValueError:
                entries = []
            for entry, ref in _match_inspected(entries or [], chunk):
                found[ref] = _local_info(ref, entry)
        return found

    def remote(self, ref: str, cancel: threading.Event | None = None) -> ImageInfo:
        """Whether the registry has ref (`manifest inspect`); ImageError when it cannot say."""
        args = ("manifest", "inspect", "-v", ref) if self.name == "docker" else ("manifest", "inspect", ref)
        done = self._call(*args, cancel=cancel)
        if done.returncode != 0:
            text = (done.stderr or done.stdout).strip()
            if any(marker in text.lower() for marker in _ABSENT):
                return ImageInfo(ref, False)
            raise ImageError(f"{self.name} manifest inspect {ref}: {_last_line(text)}")
        try:
            return _remote_info(ref, json.loads(done.stdout))
        except (ValueError, KeyError, TypeError):
            return ImageInfo(ref, True)

    def remove(self, ref: str) -> bool:
        with contextlib.suppress(ImageError):
            return self._call("image", "rm", ref).returncode == 0
        return False

    def commit(self, name: str, ref: str, labels: Mapping[str, str]) -> str | None:
        """Commit the (stopped) container name as image ref with labels added; None when done, else why not."""
        changes = [arg for key, value in labels.items() for arg in ("--change", f"LABEL {key}={json.dumps(value)}")]
        try:
            done = self._call("commit", *changes, name, ref, timeout=1800)
        except ImageError as exc:
            return str(exc)
        return None if done.returncode == 0 else _last_line(done.stderr or done.stdout) or "no output"

    def kill(self, name: str) -> None:
        """Remove a container this tool started (gone already is fine)."""
        with contextlib.suppress(ImageError):
            self._call("rm", "-f", name, timeout=60, stoppable=False)


def _match_inspected(entries: list, refs: Sequence[str]) -> Iterator[tuple[dict, str]]:
    """Pair `image inspect` entries with the refs asked (by tag or digest; else, one each, in order)."""
    unmatched = list(refs)
    for entry in entries:
        names = set(entry.get("RepoTags") or []) | set(entry.get("RepoDigests") or [])
        ref = next((r for r in unmatched if r in names or _qualified(r) in names), None)
        if ref is None and len(entries) == len(refs):
            ref = unmatched[0] if unmatched else None
        if ref is not None:
            unmatched.remove(ref)
            yield entry, ref


def _qualified(ref: str) -> str:
    """docker.io/library/… spelled as docker lists it: `rocm/x:t` stays, `ubuntu:t` is `ubuntu:t`."""
    return ref.removeprefix("docker.io/").removeprefix("library/")


def _local_info(ref: str, entry: Mapping) -> ImageInfo:
    repository = ref.rsplit("@", 1)[0].rsplit(":", 1)[0] if "/" in ref or ":" in ref else ref
    digests = [d for d in entry.get("RepoDigests") or [] if d.split("@", 1)[0] in (repository, _qualified(repository))]
    digest = digests[0].split("@", 1)[1] if digests else entry.get("Id")
    labels = ((entry.get("Config") or {}).get("Labels")) or {}
    return ImageInfo(ref, True, True, digest, entry.get("Id"), entry.get("Size"), (), labels)


def _remote_info(ref: str, data) -> ImageInfo:
    """From `docker manifest inspect -v`: one entry, or one per platform (linux/amd64 taken)."""
    if isinstance(data, list):
        data = next((d for d in data if (d.get("Descriptor", {}).get("platform") or {}).get("architecture")
                     in ("amd64", None)), data[0])
    if "Descriptor" not in data:  # podman: the manifest itself
        layers = tuple((layer["digest"], int(layer["size"])) for layer in data.get("layers", []))
        return ImageInfo(ref, True, False, None, None, sum(s for _, s in layers) or None, layers)
    manifest = data.get("SchemaV2Manifest") or data.get("OCIManifest") or {}
    layers = tuple((layer["digest"], int(layer["size"])) for layer in manifest.get("layers", []))
    return ImageInfo(ref, True, False, data["Descriptor"]["digest"], None, sum(s for _, s in layers) or None, layers)


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1][:300]


# -- vLLM's AMD container flags ------------------------------------------------------------------------------

def amd_gpu_flags(render_devices: Sequence[str], render_gid: str, shm_size: str = DEFAULT_SHM_SIZE) -> list[str]:
    """The flags vLLM's AMD test runner starts its containers with: /dev/kfd and only these render
    devices, the host's numeric render group and video, no core dumps (every bad step is a GPU fault),
    host IPC and a large /dev/shm."""
    flags = ["--device", "/dev/kfd"]
    for device in render_devices:
        flags += ["--device", device]
    return flags + ["--group-add", render_gid, "--group-add", "video", "--ulimit", "core=0", "--ipc=host",
                    f"--shm-size={shm_size}"]


def render_gid() -> str | None:
    """The host's numeric `render` group id (`getent group render`, as vLLM's runner asks), None without one."""
    getent = shutil.which("getent")
    if getent is None:
        return None
    done = subprocess.run([getent, "group", "render"], capture_output=True, text=True)
    fields = done.stdout.strip().split(":")
    return fields[2] if done.returncode == 0 and len(fields) > 2 and fields[2].isdigit() else None


def agent_render_devices(environ: Mapping[str, str] = os.environ) -> list[str] | None:
    """The render devices this agent owns, as Buildkite agent metadata (render-devices) or
    BISECTOR_RENDER_DEVICES name them ('--device /dev/dri/renderD128 …', or the paths alone); None unset."""
    for name in RENDER_DEVICE_VARIABLES:
        if environ.get(name, "").strip():
            return [token for token in environ[name].split() if token.startswith("/dev/")]
    return None


def topology_render_devices(nodes: Path = KFD_NODES) -> list[str]:
    """The render device of each GPU (KFD nodes with SIMDs, in node order: the physical GPU ids)."""
    devices = []
    for properties in sorted(nodes.glob("*/properties"), key=lambda p: int(p.parent.name)):
        fields = dict(line.split(maxsplit=1) for line in properties.read_text(errors="replace").splitlines()
                      if " " in line.strip())
        if int(fields.get("simd_count", "0")) > 0 and fields.get("drm_render_minor", "").isdigit():
            devices.append(f"/dev/dri/renderD{fields['drm_render_minor']}")
    return devices


def slot_render_devices(slot_env: Mapping[str, str], machine: Sequence[str]) -> list[str]:
    """The render devices of a step's GPUs (the slot's physical ids index the machine's), all without a
    slot. ValueError when the slot names a GPU the machine does not have."""
    granted = env_gpus(slot_env)
    if granted is None:
        return list(machine)
    missing = [gpu for gpu in granted if gpu >= len(machine)]
    if missing:
        raise ValueError(f"GPU {missing[0]} has no render device (this machine lists {len(machine)})")
    return [machine[gpu] for gpu in granted]


def inside_gpu_env(slot_env: Mapping[str, str]) -> dict[str, str]:
    """The slot's environment as the container sees it: the container holds only the slot's GPUs, so they
    count from 0 there and ROCR_VISIBLE_DEVICES (physical ids) is dropped."""
    inside = {key: value for key, value in slot_env.items()
              if key not in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}
    granted = env_gpus(slot_env)
    if granted is not None:
        relative = ",".join(str(i) for i in range(len(granted)))
        inside.update(HIP_VISIBLE_DEVICES=relative, CUDA_VISIBLE_DEVICES=relative)
    return inside


# -- a step's container ---------------------------------------------------------------------------------------

_COUNTER = itertools.count()
# Names this run's containers (with its pid, for whoever reads `docker ps`): a pid alone is no name of a run
# (another job's driver, in a PID namespace of its own, has the same one), and a name taken twice lets one run
# remove the other's containers.
RUN_TOKEN = secrets.token_hex(6)


def container_name(what: str) -> str:
    """A container name unique on this host to this run: bisector-<pid>-<run token>-<what>."""
    return f"bisector-{os.getpid()}-{RUN_TOKEN}-{what}"


@dataclass
class Container:
    """How a step's processes run inside its image (bisector.seams.ContainerLauncher): every `command` is a
    `run` argv with the step's flags, the paths it needs mounted where they are on the host, and the step's
    environment passed in; `cleanup` removes the containers it named (names no other run uses: container_name)."""

    runtime: Runtime
    image: str  # the image id: exactly the image proven to be the commit
    flags: tuple[str, ...]
    mounts: tuple[str, ...] = ()  # host paths every container of the step sees (read-write)
    read_only: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    network: str = DEFAULT_NETWORK  # as in flags: whether a step's containers can reach each other
    python: str = IMAGE_PYTHON
    names: list[str] = field(default_factory=list)

    def command(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None,
                mounts: Iterable[Path | str] = ()) -> list[str]:
        """The argv that runs argv inside the image: cwd and mounts at their host paths, env passed in."""
        name = container_name(str(next(_COUNTER)))
        self.names.append(name)
        volumes: list[str] = []
        seen: set[str] = set()
        for path, mode in [*((p, "rw") for p in (*self.mounts, cwd, *mounts)), *((p, "ro") for p in self.read_only)]:
            text = str(path)
            if text not in seen:
                seen.add(text)
                volumes += ["-v", f"{text}:{text}" + (":ro" if mode == "ro" else "")]
        variables = [f"{key}={value}" for key, value in {**self.env, **(env or {})}.items()]
        return [self.runtime.path, "run", "--rm", "--name", name, *self.flags, *volumes, "-w", str(cwd),
                *itertools.chain.from_iterable(("-e", v) for v in variables),
                "--entrypoint", argv[0], self.image, *argv[1:]]

    def cleanup(self) -> None:
        """Remove every container this step named that is still there (a killed client leaves its container)."""
        while self.names:
            self.runtime.kill(self.names.pop())


def user_flags(runtime: Runtime) -> list[str]:
    """Files written as the invoking user: podman keeps the user's id inside; docker runs as uid:gid."""
    if runtime.name == "podman":
        return ["--userns=keep-id"]
    return ["--user", f"{os.getuid()}:{os.getgid()}"]


# -- is it the commit? ----------------------------------------------------------------------------------------

# Run inside the image with its python (stdlib only): what it holds, as one JSON line.
IMAGE_PROBE = r"""
import json, os, re
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
def head(directory):
    git = os.path.join(directory, ".git")
    try:
        text = open(os.path.join(git, "HEAD")).read().strip()
        if not text.startswith("ref: "):
            return text
        ref = text[5:]
        if os.path.exists(os.path.join(git, ref)):
            return open(os.path.join(git, ref)).read().strip()
        for line in open(os.path.join(git, "packed-refs")):
            if line.rstrip().endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
hip = None
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec and spec.origin:
        text = open(os.path.join(os.path.dirname(spec.origin), "version.py")).read()
        found = re.search(r"^hip\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
        hip = found.group(1) if found else None
except Exception:
    pass
rocm = None
try:
    rocm = open(os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), ".info", "version")).read().strip()
except OSError:
    pass
checkouts = {d: head(d) for d in CHECKOUT_DIRS if os.path.isdir(os.path.join(d, ".git"))}
pins = {}
try:
    for line in open("/app/versions.txt"):
        key, _, value = line.partition(":")
        pins[key.strip()] = value.strip()
except OSError:
    pass
print(json.dumps({"vllm": version("vllm"), "torch": version("torch"), "hip": hip,
                  "aiter": version("amd-aiter") or version("aiter"), "rocm": rocm,
                  "checkouts": checkouts, "versions_txt": pins}))
""".replace("CHECKOUT_DIRS", repr(CHECKOUT_DIRS))


@dataclass(frozen=True)
class Proof:
    """Whether an image holds the commit under test, how that was shown, and what it holds."""

    ok: bool
    reason: str
    found: Mapping = field(default_factory=dict)


def prove(sha: str, info: ImageInfo, found: Mapping) -> Proof:
    """The image holds commit sha when vLLM's version carries +g<sha>, the OCI revision label is sha, or its
    vLLM checkout is at sha, and none of them names another commit: proofs that disagree prove nothing."""
    version = found.get("vllm") or ""
    claims = []
    tagged = re.search(r"\+g([0-9a-f]{7,40})", version)
    if tagged:
        claims.append((f"vLLM {version}", tagged.group(1)))
    revision = (info.labels or {}).get(REVISION_LABEL, "")
    if re.fullmatch(r"[0-9a-f]{7,40}", revision):
        claims.append((f"label {REVISION_LABEL}={revision}", revision))
    for directory, head in (found.get("checkouts") or {}).items():
        if head and re.fullmatch(r"[0-9a-f]{40}", head):
            claims.append((f"checkout {directory} at {head}", head))
    holds = [how for how, claimed in claims if sha.startswith(claimed) or claimed.startswith(sha)]
    against = [(how, claimed) for how, claimed in claims if how not in holds]
    if holds and not against:
        return Proof(True, f"holds {sha[:12]} ({holds[0]})", found)
    if holds:
        others = "; ".join(f"{how} names {claimed[:12]}" for how, claimed in against)
        return Proof(False, f"image {info.ref} contradicts itself: {holds[0]} names {sha[:12]}, but {others}: "
                            f"cannot prove it is {sha[:12]}", found)
    if claims:
        how, claimed = claims[0]
        return Proof(False, f"image {info.ref} is not commit {sha[:12]}: {how} names {claimed[:12]}", found)
    return Proof(False, f"image {info.ref} does not say which commit it holds (vLLM {version or 'not installed'}, "
                        f"no +g<sha> in its version, no {REVISION_LABEL} label, no vLLM checkout in "
                        f"{', '.join(CHECKOUT_DIRS)}): cannot prove it is {sha[:12]}", found)


# -- pull progress ----------------------------------------------------------------------------------------------

LAYERS_SUFFIX = ".layers.json"


def write_pull_layers(log_path: Path, info: ImageInfo) -> None:
    """Beside a pull's log: the layers the registry lists (id → compressed size), for progress lines."""
    Path(str(log_path) + LAYERS_SUFFIX).write_text(json.dumps(
        {digest.split(":", 1)[-1][:12]: size for digest, size in info.layers}))


def pull_progress(log_path: Path) -> str | None:
    """'3/12 layers, 1.2/4.5 GB' from a pull's log so far (layers done: downloaded or already there)."""
    sidecar = Path(str(log_path) + LAYERS_SUFFIX)
    try:
        sizes = json.loads(sidecar.read_text())
        text = Path(log_path).read_text(errors="replace")
    except (OSError, ValueError):
        return None
    done = set(re.findall(r"^([0-9a-f]{12}): (?:Download complete|Pull complete|Already exists)", text, re.M))
    total = sum(sizes.values())
    if not sizes:
        return f"{len(done)} layers" if done else None
    got = sum(sizes.get(layer, 0) for layer in done)
    return (f"{len(done & set(sizes))}/{len(sizes)} layers, "
            f"{human_size(got, decimal=True)}/{human_size(total, decimal=True)}")


# -- the images of a run ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageSettings:
    """What the user asked (--image and its options); opened on a state dir by bisector.world.world."""

    template: str
    runtime: str = "docker"
    fallback: str = "skip"     # skip | build: a commit without an image
    network: str = DEFAULT_NETWORK
    cache_size: int = 500 * 1000 ** 3
    shm_size: str = DEFAULT_SHM_SIZE


class ImageIndex:
    """Which commits have an image: answers kept in the record's `images` table, misses expiring, plus the
    images this tool pulled (for pruning). One SQLite connection per call (steps run on worker threads)."""

    def __init__(self, runtime: Runtime, db_path: Path, settings: ImageSettings):
        self.runtime, self.db_path, self.settings = runtime, Path(db_path), settings
        self.lock = threading.Lock()
        self.known: dict[str, ImageInfo] = {}
        self.in_use: dict[str, int] = {}
        self.problems: dict[str, str] = {}  # ref -> why the registry could not say
        self.stalled: str | None = None  # why the registry is not asked again: it stalled on one ref
        self.cancel = threading.Event()  # set when a resolve is interrupted: its registry calls end

    def _store(self):
        from bisector.record.store import Store
        return Store(self.db_path)

    def ref(self, sha: str) -> str:
        return expand(self.settings.template, sha)

    def resolve(self, shas: Sequence[str]) -> dict[str, ImageInfo]:
        """The image of each commit: local ones from one `image inspect`, then the record, then the registry
        (in parallel); answers are stored, misses with their time."""
        refs = {sha: self.ref(sha) for sha in shas}
        wanted = [ref for ref in dict.fromkeys(refs.values()) if ref not in self.known]
        if wanted:
            local = self.runtime.local(wanted)
            with self._store() as store:
                stored = store.images(wanted)
            now = time.time()
            ask = []
            for ref in wanted:
                if ref in local:
                    self.known[ref] = local[ref]
                elif ref in stored and (stored[ref]["present"] or now - stored[ref]["checked"] < MISS_TTL):
                    self.known[ref] = as_remote(ImageInfo.from_json(stored[ref]["info"]))
                else:
                    ask.append(ref)
            with ThreadPoolExecutor(max_workers=8) as pool:
                try:
                    answers = list(pool.map(self._ask, ask))
                except BaseException:  # Ctrl-C, SIGTERM: the calls still waiting end now, not at their bound
                    self.cancel.set()
                    raise
            with self._store() as store:
                for ref, info in zip(ask, answers):
                    if info is not None:
                        self.known[ref] = info
                        store.put_image(ref, info.present, info.to_json())
                for ref in wanted:
                    if ref in local:
                        store.put_image(ref, True, local[ref].to_json())
        return {sha: self.known.get(ref, ImageInfo(ref, False)) for sha, ref in refs.items()}

    def _ask(self, ref: str) -> ImageInfo | None:
        """The registry's answer for ref, None when it cannot say (why: problems); once it stalled on one ref,
        the others are not asked (each would wait out the bound)."""
        if self.stalled:
            self.problems[ref] = self.stalled
            return None
        try:
            return self.runtime.remote(ref, self.cancel)
        except ImageStalled as exc:
            self.stalled = self.problems[ref] = f"{exc} (the registry stalls)"
        except ImageError as exc:
            self.problems[ref] = str(exc)
        return None

    def info(self, sha: str) -> ImageInfo:
        return self.resolve([sha])[sha]

    def digest(self, sha: str) -> str | None:
        info = self.info(sha)
        return info.digest if info.present else None

    def missing_reason(self, sha: str) -> str:
        ref = self.ref(sha)
        problem = self.problems.get(ref)
        return f"image {ref} unknown: {problem}" if problem else f"no image {ref}"

    @contextlib.contextmanager
    def using(self, ref: str) -> Iterator[None]:
        """ref is in use by a step: never pruned meanwhile."""
        with self.lock:
            self.in_use[ref] = self.in_use.get(ref, 0) + 1
        try:
            yield
        finally:
            with self.lock:
                self.in_use[ref] -= 1
            with self._store() as store:
                store.touch_image(ref, time.time())

    def pulled(self, ref: str, info: ImageInfo) -> None:
        """Record that this tool pulled ref (so it may remove it), then prune beyond the cap."""
        self.known[ref] = info
        with self._store() as store:
            store.put_image(ref, True, info.to_json(), pulled=True)
        self.prune()

    def prune(self) -> list[str]:
        """Remove the least recently used images this tool pulled beyond --image-cache-size (never one in
        use, never one it did not pull); returns the refs removed."""
        with self.lock, self._store() as store:
            def remove(row) -> bool:
                if self.in_use.get(row["ref"]) or not self.runtime.remove(row["ref"]):
                    return False
                store.forget_pulled(row["ref"])
                self.known.pop(row["ref"], None)
                return True

            removed = evict(store.pulled_images(), self.settings.cache_size, remove,
                            used=lambda row: row["last_used"] or 0, size=lambda row: row["size"] or 0)
        return [row["ref"] for row in removed]


def as_remote(info: ImageInfo) -> ImageInfo:
    """A stored answer: present in the registry, not known to be here (it was not found locally now)."""
    return ImageInfo(info.ref, info.present, False, info.digest, info.image_id, info.size, info.layers, info.labels)


# -- `python -m bisector.world.images flags`: the CI launcher's flags --------------------------------------------------

def _flags_main(argv: Sequence[str]) -> int:
    """Print vLLM's AMD container flags for this agent, one per line; exit 1 with one line when the agent
    does not say which GPUs are its own or the host has no render group."""
    shm = argv[1] if len(argv) > 1 else DEFAULT_SHM_SIZE
    devices = agent_render_devices()
    gid = render_gid()
    if gid is None:
        print("this host has no 'render' group (getent group render): it cannot give a container its GPUs",
              file=sys.stderr)
        return 1
    if not devices:
        print("neither agent metadata render-devices (BUILDKITE_AGENT_META_DATA_RENDER_DEVICES) nor "
              "BISECTOR_RENDER_DEVICES names a /dev device: this runner does not say which GPUs are its own",
              file=sys.stderr)
        return 1
    print("\n".join(amd_gpu_flags(devices, gid, shm)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["flags"]:
        print("usage: python -m bisector.world.images flags [SHM_SIZE]", file=sys.stderr)
        sys.exit(2)
    sys.exit(_flags_main(sys.argv[1:]))
