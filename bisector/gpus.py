"""Which GPUs a process may use, and the environment that narrows a step to its own: one rule for local
slots, Ray workers and scenarios (unset = every GPU the machine has, set but empty = none)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from bisector.errors import UsageError

GPU_VARIABLES = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


def gpu_env(gpus: Sequence[int | str]) -> dict[str, str]:
    """Environment that makes just these GPUs (physical ids) visible to a step's processes.

    ROCR_VISIBLE_DEVICES narrows the ROCm runtime to the physical ids; HIP_ and CUDA_VISIBLE_DEVICES
    index within what ROCR leaves, so they count from 0.
    """
    relative = ",".join(str(i) for i in range(len(gpus)))
    return {"ROCR_VISIBLE_DEVICES": ",".join(map(str, gpus)), "HIP_VISIBLE_DEVICES": relative,
            "CUDA_VISIBLE_DEVICES": relative}


def gpu_slots(gpus: list[int], per_run: int) -> list[dict[str, str]]:
    """Split GPU ids into groups of per_run; each group's environment selects just those GPUs."""
    if per_run <= 0:
        raise UsageError("gpus per run must be positive")
    return [gpu_env(gpus[i:i + per_run]) for i in range(0, len(gpus) - per_run + 1, per_run)]


def parse_gpus(text: str) -> list[int]:
    """GPU ids from '0-7', '0,2,4' or a mix ('0-3,6'); raises UsageError on anything else."""
    ids: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UsageError(f"bad GPU list {text!r} (want e.g. 0-7 or 0,2,4)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise UsageError(f"bad GPU range {part.strip()!r} in {text!r}")
        ids.extend(i for i in range(first, last + 1) if i not in ids)
    return ids


def env_gpus(environ: Mapping[str, str]) -> list[int] | None:
    """Physical ids of the GPUs the environment grants; None when no GPU variable is set.

    One rule for slots and scenarios: unset = every GPU the machine has, set but empty = none.
    ROCR_VISIBLE_DEVICES holds physical ids (as a scheduler, container or slot sets it);
    HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) indexes within it, or is physical without it.
    """
    def ids(name: str) -> list[int]:
        text = environ[name].strip()
        return parse_gpus(text) if text else []

    physical = ids("ROCR_VISIBLE_DEVICES") if "ROCR_VISIBLE_DEVICES" in environ else None
    selector = next((name for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if name in environ), None)
    if selector is None:
        return physical
    chosen = ids(selector)
    return chosen if physical is None else [physical[i] for i in chosen if i < len(physical)]


def visible_gpus(environ: Mapping[str, str] = os.environ, kfd_nodes: Path = KFD_NODES) -> list[int]:
    """Physical ids of the GPUs this process may use: env_gpus, else the KFD topology's GPU nodes.

    Steps keep to these: a slot never reaches a GPU the parent was not given.
    """
    granted = env_gpus(environ)
    if granted is not None:
        return granted
    count = 0
    for props in sorted(kfd_nodes.glob("*/properties")):
        for line in props.read_text(errors="replace").splitlines():
            key, _, value = line.partition(" ")
            if key == "simd_count" and value.strip().isdigit() and int(value) > 0:
                count += 1
    return list(range(count))
