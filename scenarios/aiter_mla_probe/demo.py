"""Small vLLM-shaped source trees for the probe, and a throwaway git history with a known culprit.

The trees are written here from scratch (no vLLM code): just enough of `vllm/` for the probe to load
`rocm_aiter_mla.py`, including imports of things a source-only load must stand in for.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

STATES = ("absent", "buggy", "fixed", "rewritten", "unloadable")

MLA_COMMON = '''\
"""Common MLA pieces (demo tree)."""
import gguf  # a dependency the probe must never need
import torch

from vllm import _custom_ops as ops  # compiled extension: not in a source tree
from vllm.platforms import current_platform


class MLACommonMetadataBuilder:
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, metadata_cls=None):
        self.vllm_config = vllm_config
        self.device = device
        self.num_heads = vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)
        self.fp8_dtype = current_platform.fp8_dtype()


class MLACommonImpl:
    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args):
        self.num_heads = num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.supports_quant_query_input = True


def is_quantized_kv_cache(kv_cache_dtype):
    return kv_cache_dtype.startswith("fp8")


class MLAAttention:
    """The layer: decides whether the decode kernel gets an fp8 query."""

    def forward_decode(self, q):
        fp8_attention = is_quantized_kv_cache(self.kv_cache_dtype)
        if fp8_attention and self.impl.supports_quant_query_input:
            q = ops.quant_fp8(q, current_platform.fp8_dtype())
        return self.impl.forward_mqa(q)
'''

PLATFORM_INTERFACE = '''\
"""Platforms (demo tree)."""
from typing import NamedTuple


class DeviceCapability(NamedTuple):
    major: int
    minor: int


class Platform:
    def is_rocm(self):
        return False
'''

PLATFORM_ROCM = '''\
"""ROCm platform (demo tree): asks torch for the GPU's architecture."""
import torch

from .interface import DeviceCapability, Platform

_GCN_ARCH = torch.cuda.get_device_properties("cuda").gcnArchName


class RocmPlatform(Platform):
    def is_rocm(self):
        return True

    @classmethod
    def fp8_dtype(cls):
        return torch.float8_e4m3fnuz if "gfx942" in _GCN_ARCH else torch.float8_e4m3fn

    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(*torch.cuda.get_device_capability(device_id))
'''

CUSTOM_OPS = '''\
"""Compiled ops (demo tree)."""
from vllm._C import mla_ops  # noqa: F401
'''

AITER_MLA_HEAD = '''\
"""AITER MLA backend (demo tree)."""
import torch

from vllm.model_executor.layers.attention.mla_attention import MLACommonImpl, MLACommonMetadataBuilder
from vllm.triton_utils import triton


class AiterMLAMetadataBuilder(MLACommonMetadataBuilder):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.decode_attn_out_dtype = vllm_config.model_config.dtype
        max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.paged_kv_last_page_len = torch.ones(max_num_reqs, dtype=torch.int32, device=device)
'''

PERSISTENT_METADATA = '''\
        from aiter import dtypes, get_mla_metadata_info_v1

        kv_cache_dtype_str = getattr(vllm_config.cache_config, "cache_dtype", "auto")
{q_dtype_lines}
        sizes = get_mla_metadata_info_v1(
            max_num_reqs, 1, self.num_heads, q_dtype, kv_dtype, is_sparse=False, fast_mode=True
        )
        self.work_buffers = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in sizes]
'''

Q_DTYPE_LINES = {
    "buggy": '''\
        q_dtype = self.decode_attn_out_dtype
        if kv_cache_dtype_str in ("fp8", "fp8_e4m3", "fp8_e5m2"):
            kv_dtype = dtypes.fp8
        else:
            kv_dtype = dtypes.bf16''',
    "fixed": '''\
        q_dtype = self.decode_attn_out_dtype
        if kv_cache_dtype_str in ("fp8", "fp8_e4m3", "fp8_e5m2"):
            kv_dtype = dtypes.fp8
            q_dtype = dtypes.fp8
        else:
            kv_dtype = dtypes.bf16''',
    "rewritten": '''\
        if kv_cache_dtype_str in ("fp8", "fp8_e4m3", "fp8_e5m2"):
            kv_cache_dtype_str = "fp8"
        kv_dtype = dtypes.fp8 if kv_cache_dtype_str == "fp8" else dtypes.bf16
        q_dtype = dtypes.fp8 if kv_cache_dtype_str == "fp8" else self.decode_attn_out_dtype''',
}

AITER_MLA_TAIL = '''

@triton.jit
def _copy_pages(dst, src):
    pass


class AiterMLAImpl(MLACommonImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args):
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                         kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args)
{impl_lines}'''

CONFLICT_MARKER = "<<<<<<< HEAD\n"  # an unresolved merge: the module cannot even be compiled


def write_tree(root: Path, state: str, impl_quantizes_query: bool = True) -> None:
    """Write a minimal vLLM source tree under root whose AITER MLA builder is in the given state."""
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}; expected one of {STATES}")
    files = {
        "vllm/__init__.py": '"""vLLM (demo tree)."""\n',
        "vllm/_custom_ops.py": CUSTOM_OPS,
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/layers/__init__.py": "",
        "vllm/model_executor/layers/attention/__init__.py": "",
        "vllm/model_executor/layers/attention/mla_attention.py": MLA_COMMON,
        "vllm/platforms/__init__.py": '"""Platform detection (demo tree): needs a GPU."""\n',
        "vllm/platforms/interface.py": PLATFORM_INTERFACE,
        "vllm/platforms/rocm.py": PLATFORM_ROCM,
        "vllm/triton_utils/__init__.py": "from triton import jit  # noqa: F401\nimport triton  # noqa: F401\n",
        "vllm/v1/__init__.py": "",
        "vllm/v1/attention/__init__.py": "",
        "vllm/v1/attention/backends/__init__.py": "",
        "vllm/v1/attention/backends/mla/__init__.py": "",
        "vllm/v1/attention/backends/mla/rocm_aiter_mla.py": _aiter_mla_source(state, impl_quantizes_query),
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _aiter_mla_source(state: str, impl_quantizes_query: bool) -> str:
    head = AITER_MLA_HEAD
    if state != "absent":
        q_dtype_lines = Q_DTYPE_LINES["buggy" if state == "unloadable" else state]
        head += "\n" + PERSISTENT_METADATA.format(q_dtype_lines=q_dtype_lines)
    impl_lines = "        pass\n" if impl_quantizes_query else "        self.supports_quant_query_input = False\n"
    source = head + AITER_MLA_TAIL.format(impl_lines=impl_lines)
    return CONFLICT_MARKER + source if state == "unloadable" else source


def make_demo_repo(path: Path, commits: int = 40, culprit_index: int = 25) -> tuple[str, str, str]:
    """A git repo at path whose commit culprit_index adds the buggy persistent metadata; every other
    commit changes unrelated files. Returns (good_sha, bad_sha, culprit_sha): first, last, culprit."""
    if not 0 < culprit_index < commits:
        raise ValueError(f"culprit_index must be in 1..{commits - 1}, got {culprit_index}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=False)
    _git(path, "init", "-q", "-b", "main")
    shas = []
    for index in range(commits):
        if index == 0:
            write_tree(path, "absent")
            message = "Add AITER MLA backend"
        elif index == culprit_index:
            write_tree(path, "buggy")
            message = "[ROCm] Persistent AITER MLA decode metadata for full cudagraphs"
        else:
            notes = path / "docs" / f"note_{index % 7}.md"
            notes.parent.mkdir(exist_ok=True)
            with notes.open("a") as handle:
                handle.write(f"Change {index}\n")
            message = f"Docs: note {index}"
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", message, date=1767225600 + index * 3600)
        shas.append(_git(path, "rev-parse", "HEAD"))
    return shas[0], shas[-1], shas[culprit_index]


def _git(repo: Path, *args: str, date: int | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Demo", "GIT_AUTHOR_EMAIL": "demo@bisector.invalid",
           "GIT_COMMITTER_NAME": "Demo", "GIT_COMMITTER_EMAIL": "demo@bisector.invalid"}
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{date} +0000"
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()
