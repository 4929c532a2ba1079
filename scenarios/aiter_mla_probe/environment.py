"""What the probe supplies around the checkout's code: AITER, the platform, the process groups and the
configuration objects. Imported only in the child (needs torch)."""
from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any, Callable

import torch

from scenarios.aiter_mla_probe.contract import ProbeConfig, metadata_info
from scenarios.aiter_mla_probe.loader import Placeholder, StandIn, is_dunder, named

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


DEVICE_NAMES = {"gfx942": "AMD Instinct MI300X", "gfx950": "AMD Instinct MI355X"}
CAPABILITIES = {"gfx942": (9, 4), "gfx950": (9, 5)}
DEVICE_MEMORY = {"gfx942": 192 << 30, "gfx950": 288 << 30}


class Section(types.SimpleNamespace):
    """A configuration section: what the probe sets, and named placeholders for the rest."""

    def __init__(self, _path: str, **values):
        super().__init__(**values)
        object.__setattr__(self, "_path", _path)

    def __getattr__(self, name: str):
        if is_dunder(name) or name == "_path":
            raise AttributeError(name)
        return named(Placeholder(), f"{self._path}.{name}")


def answer_hardware_queries(config: ProbeConfig) -> None:
    """Make torch.cuda describe one GPU of config's arch: the only thing the probe says about hardware."""
    major, minor = CAPABILITIES[config.arch]
    properties = types.SimpleNamespace(
        name=DEVICE_NAMES[config.arch], gcnArchName=f"{config.arch}:sramecc+:xnack-",
        multi_processor_count=config.cu_num, major=major, minor=minor,
        total_memory=DEVICE_MEMORY[config.arch], warp_size=64)
    # torch.cuda's own functions replaced in its namespace: the stand-ins answer as duck types
    vars(torch.cuda).update(get_device_properties=lambda device=None: properties,
                            get_device_name=lambda device=None: properties.name,
                            get_device_capability=lambda device=None: (major, minor),
                            current_device=lambda: 0, device_count=lambda: 1)


def aiter_stand_in(config: ProbeConfig, sizing: Callable) -> StandIn:
    """The `aiter` package: dtypes, and `get_mla_metadata_info_v1` = sizing (which records the call)."""
    fp8 = fp8_dtype(config.arch)
    dtypes = types.SimpleNamespace(fp8=fp8, bf16=torch.bfloat16, fp16=torch.float16, fp32=torch.float32,
                                   i8=torch.int8, i32=torch.int32, u8=torch.uint8)
    dtypes.d_dtypes = {"fp8": fp8, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                       "i8": torch.int8, "i32": torch.int32, "u8": torch.uint8}

    def fill(module: types.ModuleType) -> None:
        if module.__name__ == "aiter":
            vars(module).update(dtypes=dtypes, get_mla_metadata_info_v1=sizing)
        elif module.__name__ == "aiter.dtypes":
            module.__dict__.update(vars(dtypes))
    return fill


def aiter_source_stand_ins(config: ProbeConfig, sizing: Callable) -> dict[str, StandIn]:
    """Around AITER's own source: the `aiter` package (its `__init__` imports every kernel, so it is not
    run: `get_mla_metadata_info_v1` is sizing, other names come from the submodules it imports them
    from), the hardware queries of `aiter.jit.utils.chip_info`, and `aiter.jit.core`'s JIT builder."""
    def package(module: types.ModuleType) -> None:
        if module.__name__ == "aiter":
            vars(module).update(get_mla_metadata_info_v1=sizing)

    def chip_info(module: types.ModuleType) -> None:
        vars(module).update(get_gfx=lambda: config.arch, get_gfx_runtime=lambda: config.arch,
                            get_gfx_list=lambda: [config.arch], get_cu_num=lambda: config.cu_num,
                            get_device_name=lambda: DEVICE_NAMES[config.arch].rpartition(" ")[2])

    def jit_core(module: types.ModuleType) -> None:
        def compile_ops(*args, **kwargs):
            def decorate(function):
                def compiled(*call_args, **call_kwargs):  # no kernel on the CPU: a made-up, logged answer
                    return named(Placeholder(), f"compiled AITER op {function.__name__}()")
                compiled.__name__ = function.__name__
                return compiled
            return decorate
        vars(module).update(compile_ops=compile_ops, is_experimental_enabled=_aiter_experimental_enabled)
    return {"aiter": package, "aiter.jit.utils.chip_info": chip_info, "aiter.jit.core": jit_core}


def _aiter_experimental_enabled() -> bool:
    """AITER's own rule (aiter/jit/core.py): AITER_ENABLE_EXPERIMENTAL as a non-zero integer."""
    try:
        return int(os.environ.get("AITER_ENABLE_EXPERIMENTAL", "0")) != 0
    except ValueError:
        return False


def rule_sizing(config: ProbeConfig) -> Callable:
    """`get_mla_metadata_info_v1` as the hand-written rule (contract.metadata_info) for config's arch."""
    torch_dtypes = {"uint64": torch.uint64, "int32": torch.int32}

    def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True, num_kv_splits=32, intra_batch_mode=False,
                                 max_split_per_batch=-1):
        rows = max_seqlen_qo if is_sparse else 1
        info = metadata_info(config.arch, config.cu_num, batch_size * rows, max_seqlen_qo, num_head_qo,
                             rule_dtype_name(q_dtype, config), rule_dtype_name(kv_dtype, config), fast_mode)
        return tuple((shape, torch_dtypes[dtype]) for shape, dtype in info)
    return get_mla_metadata_info_v1


def rule_dtype_name(dtype: torch.dtype, config: ProbeConfig) -> str:
    """The rule's name for dtype: "fp8" only for AITER's fp8 on config's arch (AITER compares exactly)."""
    return "fp8" if dtype == fp8_dtype(config.arch) else dtype_name(dtype)


class PlatformProxy:
    """`current_platform` as modules import it: built on first use, as vLLM's own lazy
    `vllm.platforms.current_platform` is, by build() -> (platform, description)."""

    def __init__(self, build: Callable[[], tuple[object, str]]):
        object.__setattr__(self, "build", build)
        object.__setattr__(self, "target", None)
        object.__setattr__(self, "description", None)
        object.__setattr__(self, "building", False)

    def resolve(self):
        if self.target is None:
            if self.building:
                raise AttributeError("current_platform used while the platform was still loading")
            object.__setattr__(self, "building", True)
            target, description = self.build()
            object.__setattr__(self, "target", target)
            object.__setattr__(self, "description", description)
        return self.target

    def __getattr__(self, name: str):
        return getattr(self.resolve(), name)


def platforms_stand_in(proxy: PlatformProxy) -> StandIn:
    """`vllm.platforms` (and over its source submodules): current_platform is proxy."""
    def fill(module: types.ModuleType) -> None:
        vars(module).update(current_platform=proxy)
    return fill


def modelled_platform(config: ProbeConfig) -> tuple[object, str]:
    """The checkout's RocmPlatform with hardware answered, else the hand-written stand-in; and which."""
    platform, problem = checkout_platform(config)
    if platform is None:
        return stand_in_platform(config), f"hand-written stand-in ({problem})"
    return platform, "the checkout's vllm.platforms.rocm.RocmPlatform, hardware queries answered"


def checkout_platform(config: ProbeConfig):
    """The checkout's own RocmPlatform (vllm/platforms/rocm.py) with the hardware queries answered for
    config: (platform, None), or (None, why it could not be used)."""
    try:
        rocm = importlib.import_module("vllm.platforms.rocm")
    except Exception as exc:  # noqa: BLE001 - the checkout's code, any failure
        return None, f"vllm.platforms.rocm: {type(exc).__name__}: {exc}"
    rocm_cls = loadable_class(rocm, "RocmPlatform")
    if rocm_cls is None:
        return None, "vllm/platforms/rocm.py defines no loadable RocmPlatform"
    major, minor = CAPABILITIES[config.arch]
    capability_cls = loadable_class(sys.modules.get("vllm.platforms.interface"), "DeviceCapability")
    if capability_cls is not None:
        capability = capability_cls(major=major, minor=minor)
    else:
        capability = types.SimpleNamespace(major=major, minor=minor, to_int=lambda: major * 10 + minor)
    fp8 = fp8_dtype(config.arch)

    def get_device_capability(cls, device_id=0):
        return capability

    def get_device_name(cls, device_id=0):
        return DEVICE_NAMES[config.arch]

    def num_compute_units(cls, device_id=0):
        return config.cu_num

    def supports_fp8(cls):
        return True

    def is_fp8_fnuz(cls):
        return config.arch == "gfx942"

    def fp8_dtype_of(cls):
        return fp8

    hardware = {"get_device_capability": get_device_capability, "get_device_name": get_device_name,
                "num_compute_units": num_compute_units, "supports_fp8": supports_fp8, "is_fp8_fnuz": is_fp8_fnuz,
                "fp8_dtype": fp8_dtype_of}
    # The checkout's RocmPlatform, subclassed under its own name; only its hardware queries are the probe's.
    probed = types.new_class(rocm_cls.__name__, (rocm_cls,), exec_body=lambda namespace: namespace.update(
        {name: classmethod(query) for name, query in hardware.items()}))
    return probed(), None


def loadable_class(module: object, name: str) -> type[Any] | None:
    """module's class called name, when the checkout's code defines one (not a placeholder); else None."""
    found = getattr(module, name, None)
    return found if isinstance(found, type) and not issubclass(found, Placeholder) else None


def stand_in_platform(config: ProbeConfig) -> Placeholder:
    """A hand-written ROCm platform, used only where the checkout's rocm.py does not load: hardware
    queries answered, every other attribute a named placeholder."""
    capability = CAPABILITIES[config.arch]

    class StandInRocmPlatform(Placeholder):
        device_type = device_name = "cuda"
        dispatch_key = "CUDA"

        def is_rocm(self):
            return True

        def supports_fp8(self):
            return True

        def fp8_dtype(self):
            return fp8_dtype(config.arch)

        def num_compute_units(self, device_id=0):
            return config.cu_num

        def get_device_capability(self, device_id=0):
            return types.SimpleNamespace(major=capability[0], minor=capability[1],
                                         to_int=lambda: capability[0] * 10 + capability[1])

    return named(StandInRocmPlatform(), "current_platform")


def distributed_stand_in() -> StandIn:
    """`vllm.distributed`: a single process, every group of size one."""
    group = Section("process_group", world_size=1, rank_in_group=0, rank=0, local_rank=0)

    def fill(module: types.ModuleType) -> None:
        vars(module).update(get_dcp_world_size_and_rank=lambda enabled=True: (1, 0),
                            get_pcp_world_size_and_rank=lambda enabled=True: (1, 0),
                            get_tensor_model_parallel_world_size=lambda: 1,
                            get_tensor_model_parallel_rank=lambda: 0)
        for name in ("get_tp_group", "get_dp_group", "get_pp_group", "get_dcp_group", "get_pcp_group",
                     "get_ep_group", "get_world_group"):
            setattr(module, name, lambda: group)
    return fill


def vllm_config(config: ProbeConfig) -> Section:
    """The configuration the builder is constructed with: one rank's view of a DeepSeek-style MLA model."""
    heads = config.heads
    # A Hugging Face config answers only what it has: vLLM detects model families with hasattr.
    hf_text_config = types.SimpleNamespace(
        q_lora_rank=Q_LORA_RANK, kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM,
        qk_nope_head_dim=QK_NOPE_HEAD_DIM, v_head_dim=V_HEAD_DIM, num_attention_heads=heads,
        model_type="deepseek_v3")
    model_config = Section(
        "vllm_config.model_config", dtype=MODEL_DTYPE, max_model_len=MAX_MODEL_LEN,
        hf_text_config=hf_text_config, hf_config=hf_text_config, use_mla=True, is_deepseek_mla=True,
        get_num_attention_heads=lambda parallel_config=None: heads, get_head_size=lambda: HEAD_SIZE)
    layer = Section(
        f"static_forward_context[{LAYER_NAME!r}]", num_heads=heads, head_size=HEAD_SIZE,
        q_lora_rank=Q_LORA_RANK, kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=QK_NOPE_HEAD_DIM,
        qk_rope_head_dim=QK_ROPE_HEAD_DIM, v_head_dim=V_HEAD_DIM,
        qk_head_dim=QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM, kv_cache_dtype=config.kv_cache_dtype)
    cudagraph_mode: Section = Section("vllm_config.compilation_config.cudagraph_mode",
                             has_full_cudagraphs=lambda: True, decode_mode=lambda: cudagraph_mode,
                             mixed_mode=lambda: cudagraph_mode, name="FULL_AND_PIECEWISE")
    return Section(
        "vllm_config",
        model_config=model_config,
        cache_config=Section("vllm_config.cache_config", cache_dtype=config.kv_cache_dtype, block_size=1,
                             num_gpu_blocks=None),
        scheduler_config=Section("vllm_config.scheduler_config", max_num_seqs=config.max_num_seqs,
                                 max_num_batched_tokens=8192, max_model_len=MAX_MODEL_LEN),
        parallel_config=Section("vllm_config.parallel_config", tensor_parallel_size=1, data_parallel_size=1,
                                pipeline_parallel_size=1, decode_context_parallel_size=1,
                                prefill_context_parallel_size=1, cp_kv_cache_interleave_size=1,
                                enable_expert_parallel=False),
        compilation_config=Section("vllm_config.compilation_config", cudagraph_mode=cudagraph_mode,
                                   max_cudagraph_capture_size=512, cudagraph_capture_sizes=[1, 2, 4, 8, 16],
                                   static_forward_context={LAYER_NAME: layer}),
        attention_config=Section("vllm_config.attention_config", use_prefill_query_quantization=False),
        speculative_config=None,
    )


def kv_cache_spec(config: ProbeConfig) -> Section:
    """The MLA layer's KV cache spec: one latent head per token, block size 1 (AITER's page size)."""
    dtype = torch.uint8 if config.kv_is_fp8 else MODEL_DTYPE
    return Section("kv_cache_spec", block_size=1, num_kv_heads=1, head_size=HEAD_SIZE, dtype=dtype,
                   cache_dtype_str=config.kv_cache_dtype, page_size_bytes=HEAD_SIZE * dtype.itemsize)


def impl_arguments(config: ProbeConfig) -> dict:
    """Keyword arguments the MLA layer constructs its impl with (MLACommonImpl's signature)."""
    return dict(num_heads=config.heads, head_size=HEAD_SIZE, scale=(QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM) ** -0.5,
                num_kv_heads=1, alibi_slopes=None, sliding_window=None, kv_cache_dtype=config.kv_cache_dtype,
                logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
                q_lora_rank=Q_LORA_RANK, kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=QK_NOPE_HEAD_DIM,
                qk_rope_head_dim=QK_ROPE_HEAD_DIM, qk_head_dim=QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM,
                v_head_dim=V_HEAD_DIM, kv_b_proj=named(Placeholder(), "kv_b_proj"), indexer=None)


def config_stand_in(config: Section) -> StandIn:
    """`vllm.config`: the configuration is the probe's input, so the current config is config."""
    def fill(module: types.ModuleType) -> None:
        vars(module).update(get_current_vllm_config=lambda: config, get_current_vllm_config_or_none=lambda: config)
    return fill
