"""`bisector doctor`: what this machine offers a bisection, for support requests. Reads only."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from bisector import __version__
from bisector.builds.native import installed_rocm_version, rocm_root
from bisector.machine import compile_cache
from bisector.machine.cachedir import human_size
from bisector.machine.gpus import GPU_VARIABLES
from bisector.machine.probe_env import run_probe
from bisector.redact import redact


def _command(argv: list[str], timeout: float = 20) -> str | None:
    """stdout of argv, or None when it is absent or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def python_packages(python: str) -> dict[str, str]:
    """Versions of python, torch (and its HIP), AITER and vLLM as the given interpreter sees them."""
    try:
        found = run_probe(python, ("torch", "amd-aiter", "aiter", "vllm"))
    except subprocess.CalledProcessError as exc:
        return {"error": (exc.stderr or "").strip()[-300:]}
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {"error": str(exc)}
    versions = found["versions"]
    packages = {"python": found["python"], "torch": versions["torch"],
                "aiter": versions["amd-aiter"] or versions["aiter"], "vllm": versions["vllm"],
                "torch_hip": found["torch"]["hip"] if versions["torch"] else None}
    return {name: value for name, value in packages.items() if value is not None}


def rocm_version() -> str:
    installed = installed_rocm_version()
    if installed:
        return f"{installed} ({rocm_root() / '.info' / 'version'})"
    hip = _command(["hipconfig", "--version"])
    return f"{hip} (hipconfig)" if hip else "not found"


def gpus() -> list[str]:
    """What says whether GPUs are visible: /dev/kfd, the GPU agents rocminfo lists, the selection vars."""
    lines = ["/dev/kfd present" if Path("/dev/kfd").exists() else
             "/dev/kfd absent: no AMD GPU visible to this process (container needs --device=/dev/kfd)"]
    agents = _command(["rocminfo"])
    if agents is not None:
        names = [line.split(":", 1)[1].strip() for line in agents.splitlines()
                 if line.strip().startswith("Name:") and "gfx" in line]
        lines.append(f"rocminfo: {len(names)} GPU agents" + (f" ({', '.join(names)})" if names else ""))
    else:
        lines.append("rocminfo: not found")
    for name in GPU_VARIABLES:
        if name in os.environ:
            lines.append(f"{name}={os.environ[name]}")
    return lines


def du(path: Path) -> int:
    """Bytes under path (not following symlinks); 0 when it does not exist."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def storage(state_dir: Path | None) -> list[str]:
    """Sizes of the state dir and what lives in it (record, logs, worktrees, caches)."""
    if state_dir is None:
        return ["state dir: none (not in a git repository; give --repo or --state-dir)"]
    if not state_dir.is_dir():
        return [f"state dir: {state_dir} (not created yet)"]
    free = shutil.disk_usage(state_dir).free
    lines = [f"state dir: {state_dir} ({human_size(du(state_dir))}, free {human_size(free)})"]
    for child in sorted(state_dir.iterdir()):
        if child.is_dir():
            lines.append(f"  {child.name}/: {human_size(du(child))}")
    return lines


def container_runtime(name: str) -> str:
    """The runtime --image would use: its version and path, or why there is none; where its daemon does not
    answer, that too; and the render devices and group the containers would get."""
    from bisector.errors import UsageError
    from bisector.world.images import Runtime, agent_render_devices, render_gid, topology_render_devices

    try:
        runtime = Runtime.find(name)
    except UsageError as exc:
        return f"{name} not found ({exc.message().split(': ', 1)[-1]})"
    version = runtime.version()
    daemon = _command([runtime.path, "info", "--format", "{{.ServerVersion}}"])
    line = f"{name} {version or '(version unknown)'} ({runtime.path})"
    line += f", server {daemon}" if daemon else ", its daemon does not answer (--image cannot run containers)"
    devices = agent_render_devices()
    source = "agent metadata" if devices is not None else "KFD topology"
    devices = devices if devices is not None else topology_render_devices()
    gid = render_gid()
    return line + (f"; GPUs for containers: {' '.join(devices)} ({source}), render group "
                   f"{gid or 'missing'}" if devices else "; no AMD render devices for containers")


def report(python: str, state_dir: Path | None, runtime: str = "docker", config: Sequence[str] = ()) -> str:
    """The doctor's text: one `name: value` line per fact, then the configuration's lines (bisector.cli.config);
    credentials in it redacted (bisector.redact), as configured URLs and error messages may carry them."""
    packages = python_packages(python)
    lines = [f"bisector: {__version__}",
             f"platform: {platform.platform()}",
             f"git: {_command(['git', '--version']) or 'not found'}",
             f"python (bisector): {sys.version.split()[0]} ({sys.executable})",
             f"python (scenarios): {packages.get('python', 'unusable: ' + packages.get('error', ''))} "
             f"({python})"]
    torch = packages.get("torch")
    hip = f" (HIP {packages['torch_hip']})" if packages.get("torch_hip") else " (no HIP: not a ROCm build)"
    lines += [f"torch: {torch + hip if torch else 'not installed'}",
              f"AITER: {packages.get('aiter', 'not installed')}",
              f"vLLM: {packages.get('vllm', 'not installed')}",
              f"ROCm: {rocm_version()}"]
    lines += [f"GPU: {line}" for line in gpus()]
    lines.append(f"container runtime: {container_runtime(runtime)}")
    lines += storage(state_dir)
    try:
        cap = compile_cache.size_cap()
    except ValueError as exc:
        lines.append(f"compile cache: ${compile_cache.SIZE_ENV} unusable: {exc}")
    else:
        lines.append(compile_cache.describe(compile_cache.cache_root(), cap))
    return redact("\n".join([*lines, *config]))
