"""Fake machines for the GPU scenario's tests: a `/` holding what the scenario reads of the GPUs (its
system_root), written under a directory."""
from __future__ import annotations

from pathlib import Path


def mi300x_machine(root: Path) -> Path:
    """A fake / with /dev/kfd and a CPU node plus two MI300X (gfx942) GPU nodes; root."""
    (root / "dev").mkdir(parents=True)
    (root / "dev/kfd").write_text("")
    for node, simds in enumerate((0, 304, 304)):
        directory = root / f"sys/class/kfd/kfd/topology/nodes/{node}"
        directory.mkdir(parents=True)
        (directory / "properties").write_text(f"simd_count {simds}\ngfx_target_version 90402\n")
    return root


def h200_machine(root: Path) -> Path:
    """A fake / with one NVIDIA H200 as the driver lists it; root."""
    (root / "dev").mkdir(parents=True)
    (root / "dev/nvidiactl").write_text("")
    gpu = root / "proc/driver/nvidia/gpus/0000:19:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text("Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\n")
    return root
