"""Which GPUs a process may use, and the environment that narrows a step to its own: one rule for local
slots, Ray workers and scenarios (unset = every GPU the machine has, set but empty = none)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from bisector.errors import UsageError

GPU_VARIABLES = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
# A slot that shares its GPUs with other slots: the fraction of their memory its step may take ("0.25").
SHARE_ENV = "BISECTOR_GPU_SHARE"
MOST_GPU_ID = 1023        # past any machine's GPUs: a larger id (or range end) is a typo
MOST_SLOTS_PER_GPU = 64   # ID:N at most


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


def shared_gpu_slots(spec: Sequence[tuple[int, int]], per_run: int) -> list[dict[str, str]]:
    """Slots from (GPU id, slots on it) pairs (parse_gpu_slots): consecutive GPUs grouped per_run at a
    time, as gpu_slots does; a group whose GPUs each hold n slots gives n slots, each seeing the whole
    group with SHARE_ENV = 1/n. A group's GPUs must hold the same number of slots (UsageError)."""
    if per_run <= 0:
        raise UsageError("gpus per run must be positive")
    slots: list[dict[str, str]] = []
    for start in range(0, len(spec) - per_run + 1, per_run):
        group = spec[start:start + per_run]
        counts = {count for _, count in group}
        if len(counts) > 1:
            listed = ",".join(f"{gpu}:{count}" for gpu, count in group)
            raise UsageError(f"--gpus {listed}: the {per_run} GPUs of one step must hold the same number of slots")
        count = counts.pop()
        env = gpu_env([gpu for gpu, _ in group])
        if count > 1:
            env[SHARE_ENV] = f"{1 / count:.6g}"
        slots.extend(dict(env) for _ in range(count))
    return slots


def parse_gpu_slots(text: str) -> list[tuple[int, int]]:
    """(GPU id, slots on it) from --gpus: '0-7' or '0,2,4' (one slot each) or with shares, '0:4' (four
    slots sharing GPU 0), '0:4,1:4', '0-3:2'. UsageError on anything else."""
    spec: list[tuple[int, int]] = []
    for part in text.split(","):
        ids, colon, count = part.strip().partition(":")
        if colon and not (count.strip().isdigit() and _at_most(count, MOST_SLOTS_PER_GPU, text) > 0):
            raise UsageError(f"bad GPU share {part.strip()!r} in {text!r} (want e.g. 0:4, four slots on GPU 0)")
        if not ids.strip():
            raise UsageError(f"bad GPU list {text!r} (want e.g. 0-7, 0,2,4 or 0:4)")
        for gpu in parse_gpus(ids):
            if all(gpu != seen for seen, _ in spec):
                spec.append((gpu, int(count) if colon else 1))
    return spec


def gpu_share(environ: Mapping[str, str]) -> float:
    """The share of its GPUs' memory a step may take: SHARE_ENV, 1 when unset; ValueError unless in (0, 1]."""
    text = environ.get(SHARE_ENV, "").strip()
    if not text:
        return 1.0
    share = float(text)
    if not 0 < share <= 1:
        raise ValueError(f"{SHARE_ENV}={text!r}: must be in (0, 1]")
    return share


def refuse_shared_for_timing(slots: Sequence[Mapping[str, str]], times_alone: bool = False) -> None:
    """UsageError when any slot shares its GPUs, unless the scenario times alone on them (seams.TimesAlone):
    timings taken beside other steps would interfere."""
    if not times_alone and any(SHARE_ENV in slot for slot in slots):
        raise UsageError("a performance hunt needs a GPU per step: shared slots (--gpus ID:N) would interfere "
                         "with the timings; give --gpus without :N (the dpa-fp8-kv-graph-capture scenario's "
                         "check=perf times alone on a shared GPU)")


def parse_gpus(text: str) -> list[int]:
    """GPU ids from '0-7', '0,2,4' or a mix ('0-3,6'); raises UsageError on anything else."""
    ids: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UsageError(f"bad GPU list {text!r} (want e.g. 0-7 or 0,2,4)")
        first = _at_most(low, MOST_GPU_ID, text)
        last = _at_most(high, MOST_GPU_ID, text) if dash else first
        if last < first:
            raise UsageError(f"bad GPU range {part.strip()!r} in {text!r}")
        ids.extend(i for i in range(first, last + 1) if i not in ids)
    return ids


def _at_most(digits: str, most: int, text: str) -> int:
    """A number of the GPU list text, UsageError above most (before a range of 10**20 ids is made)."""
    digits = digits.strip().lstrip("0") or "0"
    if not (digits.isascii() and digits.isdigit()):
        raise UsageError(f"bad GPU list {text!r} (want e.g. 0-7, 0,2,4 or 0:4)")
    if len(digits) > len(str(most)) or int(digits) > most:
        raise UsageError(f"bad GPU list {text!r}: {digits} is more than {most}")
    return int(digits)


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
