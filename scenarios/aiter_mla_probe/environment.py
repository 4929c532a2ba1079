"""What the probe supplies around the checkout's code: AITER, the platform, the process groups and the
configuration objects. Imported only in the child (needs torch)."""
from __future__ import annotations

import types

import torch

from scenarios.aiter_mla_probe.contract import ProbeConfig, metadata_info
from scenarios.aiter_mla_probe.loader import Placeholder, StandIn, is_dunder

MODEL_DTYPE = torch.bfloat16
Q_LORA_RANK, KV_LORA_RANK, QK_ROPE_HEAD_DIM, QK_NOPE_HEAD_DIM, V_HEAD_DIM = 1536, 512, 64, 128, 128
HEAD_SIZE = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # the MLA latent cache: one 576-wide head per token
MAX_MODEL_LEN = 4096
LAYER_NAME = "model.layers.0.self_attn.attn"


def fp8_dtype(arch: str) -> torch.dtype:
    """AITER's fp8: FNUZ on MI300 (gfx942), OCP e4m3 on MI355 (gfx950)."""
    return torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn


def dtype_name(dtype) -> str:
    """"fp8", "bf16", "fp16", ... for a torch dtype; repr for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype.is_floating_point and dtype.itemsize == 1:
            return "fp8"
        return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))
    return repr(dtype)


class Section(types.SimpleNamespace):
    """A configuration section: what the probe sets, and placeholders (feature off) for the rest."""

    def __getattr__(self, name: str):
        if is_dunder(name):
            raise AttributeError(name)
        return Placeholder()


def aiter_stand_in(config: ProbeConfig, calls: list[dict]) -> StandIn:
    """The `aiter` package: dtypes, and a `get_mla_metadata_info_v1` that records calls and applies
    the tile rule for config's arch and CU count."""
    fp8 = fp8_dtype(config.arch)
    dtypes = types.SimpleNamespace(fp8=fp8, bf16=torch.bfloat16, fp16=torch.float16, fp32=torch.float32,
                                   i8=torch.int8, i32=torch.int32, u8=torch.uint8)
    dtypes.d_dtypes = {"fp8": fp8, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                       "i8": torch.int8, "i32": torch.int32, "u8": torch.uint8}
    torch_dtypes = {"uint64": torch.uint64, "int32": torch.int32}

    def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True, *args, **kwargs):
        call = {"batch_size": batch_size, "max_seqlen_qo": max_seqlen_qo, "num_head_qo": num_head_qo,
                "q_dtype": dtype_name(q_dtype), "kv_dtype": dtype_name(kv_dtype),
                "is_sparse": is_sparse, "fast_mode": fast_mode}
        calls.append(call)
        rows = max_seqlen_qo if is_sparse else 1
        info = metadata_info(config.arch, config.cu_num, batch_size * rows, max_seqlen_qo, num_head_qo,
                             call["q_dtype"], call["kv_dtype"], fast_mode)
        return tuple((shape, torch_dtypes[dtype]) for shape, dtype in info)

    def fill(module: types.ModuleType) -> None:
        if module.__name__ == "aiter":
            module.dtypes = dtypes
            module.get_mla_metadata_info_v1 = get_mla_metadata_info_v1
        elif module.__name__ == "aiter.dtypes":
            module.__dict__.update(vars(dtypes))
    return fill


def platform_stand_in(config: ProbeConfig) -> StandIn:
    """`vllm.platforms`: a ROCm platform on config's arch."""
    capability = {"gfx942": (9, 4), "gfx950": (9, 5)}[config.arch]

    class RocmPlatform(Placeholder):
        device_type = device_name = "cuda"
        dispatch_key = "CUDA"

        def is_rocm(self):
            return True

        def fp8_dtype(self):
            return fp8_dtype(config.arch)

        def num_compute_units(self, device_id=0):
            return config.cu_num

        def get_device_capability(self, device_id=0):
            return types.SimpleNamespace(major=capability[0], minor=capability[1],
                                         to_int=lambda: capability[0] * 10 + capability[1])

    platform = RocmPlatform()

    def fill(module: types.ModuleType) -> None:
        module.current_platform = platform
        module.on_gfx942 = lambda: config.arch == "gfx942"
        module.on_gfx950 = lambda: config.arch == "gfx950"
        module.on_mi3xx = module.on_gfx9 = lambda: True
        module.get_cdna_version = lambda: 3 if config.arch == "gfx942" else 4
    return fill


def distributed_stand_in() -> StandIn:
    """`vllm.distributed`: a single process, every group of size one."""
    group = Section(world_size=1, rank_in_group=0, rank=0, local_rank=0)

    def fill(module: types.ModuleType) -> None:
        for name in ("get_tp_group", "get_dp_group", "get_pp_group", "get_dcp_group", "get_pcp_group",
                     "get_ep_group", "get_world_group"):
            setattr(module, name, lambda: group)
        module.get_tensor_model_parallel_world_size = lambda: 1
        module.get_tensor_model_parallel_rank = lambda: 0
    return fill


def vllm_config(config: ProbeConfig) -> Section:
    """The configuration the builder is constructed with: one rank's view of a DeepSeek-style MLA model."""
    heads = config.heads
    # A Hugging Face config answers only what it has: vLLM detects model families with hasattr.
    hf_text_config = types.SimpleNamespace(
        q_lora_rank=Q_LORA_RANK, kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM,
        qk_nope_head_dim=QK_NOPE_HEAD_DIM, v_head_dim=V_HEAD_DIM, num_attention_heads=heads,
        model_type="deepseek_v3")
    model_config = Section(dtype=MODEL_DTYPE, max_model_len=MAX_MODEL_LEN, hf_text_config=hf_text_config,
                           hf_config=hf_text_config, use_mla=True, is_deepseek_mla=True,
                           get_num_attention_heads=lambda parallel_config=None: heads,
                           get_head_size=lambda: HEAD_SIZE)
    layer = Section(num_heads=heads, head_size=HEAD_SIZE, q_lora_rank=Q_LORA_RANK,
                    kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=QK_NOPE_HEAD_DIM,
                    qk_rope_head_dim=QK_ROPE_HEAD_DIM, v_head_dim=V_HEAD_DIM,
                    qk_head_dim=QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM, kv_cache_dtype=config.kv_cache_dtype)
    cudagraph_mode = Section(has_full_cudagraphs=lambda: True, decode_mode=lambda: cudagraph_mode,
                             mixed_mode=lambda: cudagraph_mode, name="FULL_AND_PIECEWISE")
    return Section(
        model_config=model_config,
        cache_config=Section(cache_dtype=config.kv_cache_dtype, block_size=1, num_gpu_blocks=None),
        scheduler_config=Section(max_num_seqs=config.max_num_seqs, max_num_batched_tokens=8192,
                                 max_model_len=MAX_MODEL_LEN),
        parallel_config=Section(tensor_parallel_size=1, data_parallel_size=1, pipeline_parallel_size=1,
                                decode_context_parallel_size=1, prefill_context_parallel_size=1,
                                cp_kv_cache_interleave_size=1, enable_expert_parallel=False),
        compilation_config=Section(cudagraph_mode=cudagraph_mode, max_cudagraph_capture_size=512,
                                   cudagraph_capture_sizes=[1, 2, 4, 8, 16],
                                   static_forward_context={LAYER_NAME: layer}),
        attention_config=Section(use_prefill_query_quantization=False),
        speculative_config=None,
    )


def kv_cache_spec(config: ProbeConfig) -> Section:
    """The MLA layer's KV cache spec: one latent head per token, block size 1 (AITER's page size)."""
    dtype = torch.uint8 if config.kv_is_fp8 else MODEL_DTYPE
    return Section(block_size=1, num_kv_heads=1, head_size=HEAD_SIZE, dtype=dtype,
                   cache_dtype_str=config.kv_cache_dtype, page_size_bytes=HEAD_SIZE * dtype.itemsize)


def config_stand_in(config: Section) -> StandIn:
    """`vllm.config`: the configuration is the probe's input, so the current config is config."""
    def fill(module: types.ModuleType) -> None:
        module.get_current_vllm_config = lambda: config
        module.get_current_vllm_config_or_none = lambda: config
    return fill
