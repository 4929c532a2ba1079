"""Is a ROCm GPU usable here? Read from /dev/kfd and the KFD topology in sysfs (root is a seam)."""
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
