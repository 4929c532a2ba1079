"""Where steps run: a pool of local slots (CPU jobs or GPU groups), each with its own environment."""
from __future__ import annotations

import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping

GPU_VARIABLES = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def gpu_slots(gpus: list[int], per_run: int) -> list[dict[str, str]]:
    """Split GPU ids into groups of per_run; each group's environment selects just those GPUs."""
    if per_run <= 0:
        raise ValueError("gpus per run must be positive")
    groups = [gpus[i:i + per_run] for i in range(0, len(gpus) - per_run + 1, per_run)]
    return [{name: ",".join(map(str, group)) for name in GPU_VARIABLES} for group in groups]


class LocalExecutor:
    """Runs step functions on a fixed set of slots; a slot's env goes to the step it hosts."""

    def __init__(self, slots: list[Mapping[str, str]]):
        if not slots:
            raise ValueError("no slots to run steps on")
        self.slots: queue.Queue = queue.Queue()
        for slot in slots:
            self.slots.put(dict(slot))
        self.pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="step")
        self.size = len(slots)

    def submit(self, step: Callable[[dict[str, str]], object]) -> Future:
        return self.pool.submit(self._on_slot, step)

    def _on_slot(self, step: Callable[[dict[str, str]], object]) -> object:
        slot = self.slots.get()
        try:
            return step(slot)
        finally:
            self.slots.put(slot)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
