"""A commit's native identity: the toolchain and the tree ids of the paths that decide the compiled extensions."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from bisector.machine.probe_env import run_probe

# Paths whose content decides the compiled extensions (vLLM's docker/Dockerfile.rocm build stage).
NATIVE_PATHS = ("csrc", "CMakeLists.txt", "cmake", "setup.py", "pyproject.toml",
                "requirements/rocm-build.txt", "requirements/build/rocm.txt", "rust", "tools/build_rust.py")
DEFAULT_ARCH = "gfx942"


@dataclass(frozen=True)
class Toolchain:
    rocm: str
    torch: str
    python: str
    arch: str

    def fingerprint(self) -> str:
        return f"rocm={self.rocm} torch={self.torch} python={self.python} arch={self.arch}"


def detect_toolchain(python: str, arch: str | None) -> Toolchain:
    """ROCm version, torch version and Python version of the build's interpreter, and the arch list."""
    try:
        found = run_probe(python, ("torch",))
    except (OSError, subprocess.SubprocessError, ValueError):
        raise ValueError(f"cannot run the build's Python: {python}") from None
    torch_version = found["versions"]["torch"] or "none"
    hip_version = (found["torch"]["hip"] if torch_version != "none" else None) or "none"
    return Toolchain(rocm=installed_rocm_version() or hip_version, torch=torch_version,
                     python=".".join(found["python"].split(".")[:2]),
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
