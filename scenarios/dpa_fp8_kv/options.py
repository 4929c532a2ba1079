"""The scenario's options, parsed and validated once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from bisector.errors import ScenarioError

OPTION_DEFAULTS = {
    "dp": "1",
    "tp": "1",
    "heads": "128",
    "layers": "1",
    "kv_cache_dtype": "fp8",
    "cudagraph_mode": "FULL_DECODE_ONLY",
    "max_num_seqs": "4",
    "max_model_len": "1024",
    "gpu_memory_utilization": "0.5",
}
KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bfloat16")
CUDAGRAPH_MODES = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "FULL")


@dataclass(frozen=True)
class Options:
    """heads is the model's attention-head count; each TP rank holds heads // tp of them."""

    dp: int
    tp: int
    heads: int
    layers: int
    kv_cache_dtype: str
    cudagraph_mode: str
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.tp

    @property
    def gpus(self) -> int:
        return self.dp * self.tp


def parse_options(raw: Mapping[str, str]) -> Options:
    """Options from KEY=VALUE strings; ScenarioError names the first bad one."""
    options = Options(
        dp=_int(raw, "dp", 1),
        tp=_int(raw, "tp", 1),
        heads=_int(raw, "heads", 1),
        layers=_int(raw, "layers", 1),
        kv_cache_dtype=_choice(raw, "kv_cache_dtype", KV_CACHE_DTYPES),
        cudagraph_mode=_choice(raw, "cudagraph_mode", CUDAGRAPH_MODES),
        max_num_seqs=_int(raw, "max_num_seqs", 1),
        max_model_len=_int(raw, "max_model_len", 64),
        gpu_memory_utilization=_fraction(raw, "gpu_memory_utilization"),
    )
    if options.layers > 2:
        raise ScenarioError(f"option layers={options.layers}: must be 1 or 2")
    if options.heads % options.tp:
        raise ScenarioError(f"option heads={options.heads} is not divisible by tp={options.tp}")
    return options


def _int(raw: Mapping[str, str], key: str, minimum: int) -> int:
    try:
        value = int(raw[key])
    except ValueError:
        raise ScenarioError(f"option {key}={raw[key]!r}: not an integer") from None
    if value < minimum:
        raise ScenarioError(f"option {key}={value}: must be at least {minimum}")
    return value


def _choice(raw: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    if raw[key] not in choices:
        raise ScenarioError(f"option {key}={raw[key]!r}: must be one of {', '.join(choices)}")
    return raw[key]


def _fraction(raw: Mapping[str, str], key: str) -> float:
    try:
        value = float(raw[key])
    except ValueError:
        raise ScenarioError(f"option {key}={raw[key]!r}: not a number") from None
    if not 0 < value <= 1:
        raise ScenarioError(f"option {key}={value}: must be in (0, 1]")
    return value
