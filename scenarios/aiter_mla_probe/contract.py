"""The probe's configuration, its judgement, and AITER's MLA metadata tile rule (shared/README.md) in
plain Python: the fallback used when no AITER source is available.

Dtypes are named "fp8", "bf16" or "fp16" here; the child maps torch dtypes to these names.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping

from bisector.errors import ScenarioError

RESULT_PREFIX = "PROBE-RESULT "  # the child's last line: RESULT_PREFIX + JSON
REDUCE_FINAL_MAP = 4  # index of reduce_final_map (tile_cnt, 2) in get_mla_metadata_info_v1's answer
ARCH_CU_COUNTS = {"gfx942": 304, "gfx950": 256}  # MI300X, MI355X
KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bf16", "bfloat16")


@dataclass(frozen=True)
class ProbeConfig:
    """One rank's decode configuration: what the builder is constructed for."""

    heads: int = 128
    kv_cache_dtype: str = "fp8"
    arch: str = "gfx942"
    cu_num: int = 304
    max_num_seqs: int = 16

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "ProbeConfig":
        """Parse scenario options (strings); an empty cu_num means the arch's CU count."""
        arch = options.get("arch", cls.arch)
        if arch not in ARCH_CU_COUNTS:
            raise ScenarioError(f"option arch={arch!r}: expected one of {', '.join(ARCH_CU_COUNTS)}")
        kv_cache_dtype = options.get("kv_cache_dtype", cls.kv_cache_dtype)
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ScenarioError(f"option kv_cache_dtype={kv_cache_dtype!r}: expected one of "
                                f"{', '.join(KV_CACHE_DTYPES)}")
        heads = _positive_int("heads", options.get("heads") or str(cls.heads))
        if heads % 8:
            raise ScenarioError(f"option heads={heads}: AITER MLA needs a multiple of 8 heads per rank")
        return cls(heads=heads, kv_cache_dtype=kv_cache_dtype, arch=arch,
                   cu_num=_positive_int("cu_num", options.get("cu_num") or str(ARCH_CU_COUNTS[arch])),
                   max_num_seqs=_positive_int("max_num_seqs",
                                              options.get("max_num_seqs") or str(cls.max_num_seqs)))

    @property
    def kv_is_fp8(self) -> bool:
        return self.kv_cache_dtype.startswith("fp8")

    def as_dict(self) -> dict:
        return asdict(self)


def _positive_int(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ScenarioError(f"option {key}={raw!r}: expected a positive integer") from None
    if value <= 0:
        raise ScenarioError(f"option {key}={raw!r}: expected a positive integer")
    return value


def qo_tiles_per_batch(arch: str, heads: int, qo_len: int, q_dtype: str, kv_dtype: str) -> int:
    """AITER's Q tiles per batch: 128-row tiles where a kernel packs them, else 16-row tiles."""
    packed = qo_len * heads
    fp8 = q_dtype == kv_dtype == "fp8"
    bf16 = q_dtype == kv_dtype == "bf16"
    wide = (heads == 16
            or (arch == "gfx942" and heads == 128 and fp8)
            or (arch == "gfx950" and fp8 and (heads in (64, 128) or (heads == 32 and qo_len == 4)))
            or (arch == "gfx950" and bf16 and packed % 128 == 0))
    return math.ceil(packed / (128 if wide else 16))


def metadata_info(arch: str, cu_num: int, batch_size: int, qo_len: int, heads: int, q_dtype: str,
                  kv_dtype: str, fast_mode: bool = True) -> tuple[tuple[tuple[int, ...], str], ...]:
    """The six (shape, dtype name) pairs `get_mla_metadata_info_v1` returns: work_metadata_ptrs,
    work_indptr, work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map."""
    tiles = qo_tiles_per_batch(arch, heads, qo_len, q_dtype, kv_dtype)
    tile_cnt = batch_size * tiles
    if fast_mode:
        max_work = (batch_size + cu_num - 1) * tiles
        max_split_tiles = min(batch_size + cu_num - 1, (cu_num - 1) * 2) * tiles
    else:
        max_work = max_split_tiles = tile_cnt * cu_num
    return (((2,), "uint64"), ((cu_num + 1,), "int32"), ((max_work, 8), "int32"),
            ((tile_cnt + 1,), "int32"), ((tile_cnt, 2), "int32"), ((max_split_tiles,), "int32"))


@dataclass(frozen=True)
class Judgement:
    verdict: str  # "good" or "bad"
    reason: str
    details: dict


def judge(config: ProbeConfig, call: Mapping, names: Mapping[str, str], same_dtype: bool,
          sized: tuple, kernel: tuple, aiter: str = "hand-written AITER tile rule") -> Judgement:
    """Compare the metadata sized for the builder's q dtype with the metadata for the q dtype the decode
    kernel gets (both as AITER's six (shape, dtype) pairs for the same call arguments)."""
    heads, qo_len = call["num_head_qo"], call["max_seqlen_qo"]
    rows = call["batch_size"] * (qo_len if call.get("is_sparse") else 1)
    sized_tiles, kernel_tiles = (info[REDUCE_FINAL_MAP][0][0] // rows for info in (sized, kernel))
    sized_q, kernel_q, kv = names["sized_q_dtype"], names["kernel_q_dtype"], names["kv_dtype"]
    details = {"heads": heads, "qo_len": qo_len, **names, "sized_tiles_per_batch": sized_tiles,
               "kernel_tiles_per_batch": kernel_tiles,
               "sized_metadata": [list(shape) for shape, _ in sized],
               "kernel_metadata": [list(shape) for shape, _ in kernel]}
    where = f"{heads} heads, qo_len {qo_len}, kv {kv}, {config.arch}, {aiter}"
    if same_dtype:
        return Judgement("good", f"consistent: metadata sized for q {sized_q}, the decode kernel gets "
                                 f"q {kernel_q} ({where}: {_tiles(sized_tiles)})", details)
    if sized == kernel:
        # The bug's code runs but this AITER hides it: a machine-readable note, so a backport says "masked".
        details["masked"] = f"{aiter} sizes q {sized_q} and {kernel_q} alike at {heads} heads, {config.arch}"
        return Judgement("good", f"q dtype mismatch without effect: metadata sized for q {sized_q}, kernel "
                                 f"gets q {kernel_q}, but AITER sizes both alike ({where}: "
                                 f"{_tiles(sized_tiles)})", details)
    return Judgement("bad", f"q dtype mismatch changes AITER tiling: metadata sized for q {sized_q} "
                            f"({_tiles(sized_tiles)}), decode kernel gets q {kernel_q} "
                            f"({_tiles(kernel_tiles)}) at {where}", details)


def _tiles(count: int) -> str:
    return f"{count} tile{'' if count == 1 else 's'} per batch"
