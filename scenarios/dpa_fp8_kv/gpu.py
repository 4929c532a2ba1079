"""Is a GPU usable here? ROCm: /dev/kfd and the KFD topology in sysfs; NVIDIA: the driver's /proc entries.

root is a seam: tests point it at a fake tree.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KFD_NODES = "sys/class/kfd/kfd/topology/nodes"


@dataclass(frozen=True)
class GpuProbe:
    targets: tuple[str, ...]  # gfx name per GPU node, e.g. ("gfx942",) * 8
    problem: str | None = None  # why no GPU is usable


def probe_rocm_gpus(root: Path = Path("/")) -> GpuProbe:
    """GPU nodes (KFD nodes with SIMDs) when /dev/kfd is usable; else the problem in a few words."""
    kfd = root / "dev/kfd"
    if not kfd.exists():
        return GpuProbe((), "/dev/kfd missing")
    if not os.access(kfd, os.R_OK | os.W_OK):
        return GpuProbe((), "/dev/kfd not accessible: is this user in the render and video groups?")
    targets = []
    for properties in sorted((root / KFD_NODES).glob("*/properties"), key=lambda p: int(p.parent.name)):
        fields = dict(line.split(maxsplit=1) for line in properties.read_text().splitlines()
                      if " " in line.strip())
        if int(fields.get("simd_count", "0")) > 0:
            targets.append(gfx_name(int(fields.get("gfx_target_version", "0"))))
    if not targets:
        return GpuProbe((), f"no KFD node with SIMDs under /{KFD_NODES}")
    return GpuProbe(tuple(targets))


def gfx_name(target_version: int) -> str:
    """KFD gfx_target_version to the LLVM target name: 90402 → gfx942, 90010 → gfx90a."""
    major, minor, stepping = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor:x}{stepping:x}"


NVIDIA_GPUS = "proc/driver/nvidia/gpus"


def probe_nvidia_gpus(root: Path = Path("/")) -> GpuProbe:
    """NVIDIA GPUs the driver lists under /proc/driver/nvidia/gpus (one folder per GPU, its `information`
    file naming the model), else the /dev/nvidia<N> nodes, when /dev/nvidiactl is there; else the problem."""
    if not (root / "dev/nvidiactl").exists():
        return GpuProbe((), "/dev/nvidiactl missing")
    models = []
    for gpu in sorted((root / NVIDIA_GPUS).glob("*")):
        info = gpu / "information"
        fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line) \
            if info.is_file() else {}
        models.append(fields.get("Model", "NVIDIA GPU").strip())
    if not models:  # some containers mount the device nodes without the /proc entries
        models = ["NVIDIA GPU" for node in (root / "dev").glob("nvidia*") if node.name[6:].isdigit()]
    if not models:
        return GpuProbe((), f"no GPU under /{NVIDIA_GPUS} or /dev/nvidia<N>")
    return GpuProbe(tuple(models))
