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
