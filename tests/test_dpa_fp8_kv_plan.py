"""Options, the tiny DeepSeek-V3 config, the child launch plan and the GPU probe: pure parts."""
import json
import sys
from pathlib import Path

import pytest

from bisector.errors import ScenarioError
from bisector.machine.gpus import gpu_env
from scenarios import create
from scenarios.dpa_fp8_kv import child
from scenarios.dpa_fp8_kv.config import deepseek_v3_config
from scenarios.dpa_fp8_kv.environment import aiter_switches, checkout_pins, pin_violations, satisfies
from scenarios.dpa_fp8_kv.gpu import gfx_name, probe_nvidia_gpus, probe_rocm_gpus
from scenarios.dpa_fp8_kv.model import prepare_model
from scenarios.dpa_fp8_kv.options import OPTION_DEFAULTS, parse_options
from scenarios.dpa_fp8_kv.plan import CUDA_ENV, DEFAULT_TIMEOUT, build_plan, step_devices

pytestmark = [pytest.mark.unit, pytest.mark.gpu_plan]

NAME = "dpa-fp8-kv-graph-capture"


def options(**overrides):
    return parse_options({**OPTION_DEFAULTS, **{key: str(value) for key, value in overrides.items()}})


ROCM_ENV = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "1", "VLLM_ROCM_USE_AITER_MOE": "0"}


def plan(opts, devices=("0", "1", "2", "3", "4", "5", "6", "7"), base_env=None, timeout=None,
         platform="rocm"):
    return build_plan(opts, platform=platform, platform_env=ROCM_ENV if platform == "rocm" else CUDA_ENV,
                      python="/venv/bin/python", child_script=Path("/tmp/w/child.py"),
                      model_dir=Path("/tmp/w/model"), checkout=Path("/src/vllm"), devices=list(devices),
                      base_env=base_env or {"PATH": "/usr/bin"}, master_port=29555, timeout=timeout)


def test_defaults_are_one_gpu_with_128_heads_per_rank():
    scenario = create(NAME)
    assert scenario.gpus_per_run == 1
    assert scenario.settings.heads_per_rank == 128
    assert scenario.settings.kv_cache_dtype == "fp8"


def test_tp8_is_the_16_heads_per_rank_control():
    scenario = create(NAME, {"tp": "8"})
    assert scenario.gpus_per_run == 8
    assert scenario.settings.heads_per_rank == 16


def test_gpus_per_run_is_dp_times_tp():
    assert create(NAME, {"dp": "2", "tp": "2"}).gpus_per_run == 4


@pytest.mark.parametrize("raw, message", [
    ({"dp": "two"}, "option dp='two': not an integer"),
    ({"dp": "0"}, "option dp=0: must be at least 1"),
    ({"layers": "65"}, "option layers=65: must be at most 64"),
    ({"heads": "128", "tp": "3"}, "option heads=128 is not divisible by tp=3"),
    ({"kv_cache_dtype": "int8"}, "option kv_cache_dtype='int8': must be one of"),
    ({"cudagraph_mode": "PIECEWISE"}, "option cudagraph_mode='PIECEWISE': must be one of"),
    ({"gpu_memory_utilization": "1.5"}, "option gpu_memory_utilization=1.5: must be in (0, 1]"),
    ({"max_model_len": "16"}, "option max_model_len=16: must be at least 64"),
    ({"batch": "4"}, "has no option 'batch'"),
    ({"platform": "xpu"}, "option platform='xpu': must be one of auto, rocm, cuda"),
    ({"attention_backend": "TRITON MLA;"}, "option attention_backend='TRITON MLA;': not a backend name"),
    ({"kv_cache_memory_bytes": "lots"}, "option kv_cache_memory_bytes='lots': not a size"),
])
def test_bad_options_are_one_line_errors(raw, message):
    with pytest.raises(ScenarioError) as err:
        create(NAME, raw)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_config_has_the_mla_shapes_aiter_requires(tmp_path):
    model = prepare_model(tmp_path / "cache", options(layers=2), seeded=False, python=sys.executable)
    config = json.loads((model.path / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert config["model_type"] == "deepseek_v3"
    assert config["kv_lora_rank"] == 512
    assert config["qk_rope_head_dim"] == 64
    assert config["num_attention_heads"] == config["num_key_value_heads"] == 128
    assert config["num_hidden_layers"] == 2
    assert config["first_k_dense_replace"] == 1  # layer 0 dense, layer 1 MoE
    assert config["num_experts_per_tok"] <= config["n_routed_experts"] <= 16
    assert config["n_routed_experts"] % config["n_group"] == 0
    assert config["torch_dtype"] == "bfloat16"
    assert config["max_position_embeddings"] == 1024


def test_config_widths_shard_evenly():
    config = deepseek_v3_config(options(dp=2, tp=4, heads=64, max_model_len=2048))
    assert config["num_attention_heads"] == 64
    assert config["intermediate_size"] % 4 == 0
    assert config["moe_intermediate_size"] % 8 == 0  # experts shard over dp x tp
    assert config["vocab_size"] % 4 == 0
    assert config["first_k_dense_replace"] == 0  # one layer, and it is MoE
    assert config["max_position_embeddings"] == 2048


def test_single_rank_plan():
    [launch] = plan(options(), base_env={"PATH": "/usr/bin", "PYTHONPATH": "/extra",
                                         "VLLM_DP_SIZE": "4"})
    assert launch.argv == ["/venv/bin/python", "/tmp/w/child.py", "--model", "/tmp/w/model",
                           "--tp", "1", "--kv-cache-dtype", "fp8", "--cudagraph-mode", "FULL_DECODE_ONLY",
                           "--max-num-seqs", "512", "--max-model-len", "1024",
                           "--gpu-memory-utilization", "0.5", "--attention-backend", "ROCM_AITER_MLA",
                           "--kv-cache-memory-bytes", str(2 ** 30)]
    assert {key: launch.env[key] for key in ROCM_ENV} == ROCM_ENV
    assert launch.env["HIP_VISIBLE_DEVICES"] == launch.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert launch.env["PYTHONPATH"] == "/src/vllm:/extra"
    assert launch.env["PATH"] == "/usr/bin"
    assert not any(key.startswith("VLLM_DP_") for key in launch.env)  # a stray DP env is dropped
    assert launch.timeout == DEFAULT_TIMEOUT


def test_cuda_plan_has_no_aiter_switches_and_only_cuda_visibility():
    base = {"PATH": "/usr/bin", "VLLM_ROCM_USE_AITER": "1", "HIP_VISIBLE_DEVICES": "3"}
    [launch] = plan(options(), devices=["3"], base_env=base, platform="cuda")
    assert launch.argv[launch.argv.index("--attention-backend") + 1] == "TRITON_MLA"
    assert not any(key.startswith(("VLLM_ROCM_USE_AITER", "HIP_")) for key in launch.env)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert launch.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_attention_backend_option_wins_on_either_platform():
    opts = options(attention_backend="flashmla")
    assert (opts.backend_for("cuda"), opts.backend_for("rocm")) == ("FLASHMLA", "FLASHMLA")
    assert options().backend_for("rocm") == "ROCM_AITER_MLA"


def test_defaults_reach_the_reported_capture_sizes_with_a_bounded_kv_cache():
    opts = options()
    assert opts.max_num_seqs == 512  # vLLM then captures 51 decode graphs, as in the report
    assert opts.kv_cache_memory_bytes == 2 ** 30
    assert options(kv_cache_memory_bytes="512M").kv_cache_memory_bytes == 512 * 2 ** 20
    assert options(kv_cache_memory_bytes="0").kv_cache_memory_bytes == 0


def write_envs_py(checkout, names):
    (checkout / "vllm").mkdir(parents=True)
    (checkout / "vllm/envs.py").write_text("".join(f'    "{name}": lambda: False,\n' for name in names))


def test_aiter_switches_turn_off_what_the_checkout_has_except_mla(tmp_path):
    write_envs_py(tmp_path, ["VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MLA", "VLLM_ROCM_USE_AITER_MOE",
                             "VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA", "VLLM_ROCM_USE_AITER_LINEAR"])
    assert aiter_switches(tmp_path) == {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "1",
                                        "VLLM_ROCM_USE_AITER_LINEAR": "0", "VLLM_ROCM_USE_AITER_MOE": "0"}


def write_requirements(checkout, files):
    (checkout / "requirements").mkdir(parents=True)
    for name, text in files.items():
        (checkout / "requirements" / name).write_text(text)


def test_checkout_pins_per_platform(tmp_path):
    write_requirements(tmp_path, {"common.txt": "regex\ntransformers >= 5.5.3  # new models\n",
                                  "cuda.txt": "-r common.txt\ntorch==2.11.0\ntorchaudio==2.11.0\n",
                                  "rocm.txt": "-r common.txt\n"})
    assert checkout_pins(tmp_path, "cuda") == {"transformers": (">= 5.5.3", "requirements/common.txt"),
                                               "torch": ("==2.11.0", "requirements/cuda.txt")}
    assert checkout_pins(tmp_path, "rocm") == {"transformers": (">= 5.5.3", "requirements/common.txt")}


def test_pin_violations_name_both_versions(tmp_path):
    pins = {"transformers": (">= 5.5.3", "requirements/common.txt"), "torch": ("==2.11.0", "requirements/cuda.txt")}
    assert pin_violations(pins, {"transformers": "5.17.0", "torch": "2.11.0+cu130"}) == []
    assert pin_violations(pins, {"transformers": "4.57.1", "torch": None}) == [
        "torch ==2.11.0 required by requirements/cuda.txt, not installed",
        "transformers >= 5.5.3 required by requirements/common.txt, environment has 4.57.1"]


@pytest.mark.parametrize("version, specifier, expected", [
    ("2.11.0+cu130", "==2.11.0", True), ("2.10.0", "==2.11.0", False), ("2.11", "==2.11.0", True),
    ("4.56.2", ">=4.56.0,<5", True), ("5.0.0", ">=4.56.0,<5", False), ("2.9.1", "==2.9.*", True),
    ("2.10.0", "~=2.9", True), ("3.0", "~=2.9", False), ("5.0.0rc1", ">= 4.57", True), ("1.0", "!=1.0", False),
])
def test_satisfies(version, specifier, expected):
    assert satisfies(version, specifier) is expected


def fake_nvidia(root, models):
    (root / "dev").mkdir(parents=True)
    (root / "dev/nvidiactl").write_text("")
    for n, model in enumerate(models):
        directory = root / f"proc/driver/nvidia/gpus/0000:{n:02x}:00.0"
        directory.mkdir(parents=True)
        (directory / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\n")


def test_nvidia_probe_reads_the_driver_entries(tmp_path):
    fake_nvidia(tmp_path, ["NVIDIA H200", "NVIDIA H200"])
    assert probe_nvidia_gpus(tmp_path).targets == ("NVIDIA H200", "NVIDIA H200")


def test_nvidia_probe_falls_back_to_device_nodes_and_says_when_there_is_none(tmp_path):
    assert probe_nvidia_gpus(tmp_path).problem == "/dev/nvidiactl missing"
    fake_nvidia(tmp_path, [])
    assert probe_nvidia_gpus(tmp_path).problem.startswith("no GPU under /proc/driver/nvidia/gpus")
    (tmp_path / "dev/nvidia0").write_text("")
    assert probe_nvidia_gpus(tmp_path).targets == ("NVIDIA GPU",)


def test_dp2_plan_gives_each_rank_its_own_devices_and_dp_env():
    launches = plan(options(dp=2, tp=2), devices=["4", "5", "6", "7"], timeout=600)
    assert [launch.rank for launch in launches] == [0, 1]
    assert [launch.env["HIP_VISIBLE_DEVICES"] for launch in launches] == ["4,5", "6,7"]
    assert [launch.env["CUDA_VISIBLE_DEVICES"] for launch in launches] == ["4,5", "6,7"]
    for rank, launch in enumerate(launches):
        assert launch.env["VLLM_DP_RANK"] == str(rank)
        assert launch.env["VLLM_DP_RANK_LOCAL"] == "0"  # each rank sees only its own GPUs
        assert launch.env["VLLM_DP_SIZE"] == "2"
        assert launch.env["VLLM_DP_MASTER_IP"] == "127.0.0.1"
        assert launch.env["VLLM_DP_MASTER_PORT"] == "29555"
        assert launch.argv[launch.argv.index("--tp") + 1] == "2"
        assert launch.timeout == 600
    assert launches[0].argv == launches[1].argv


def test_rocr_visible_devices_is_dropped_for_physical_hip_ids():
    slot = gpu_env([4, 5])
    launches = plan(options(dp=2), devices=step_devices(slot, 8), base_env=slot)
    assert [launch.env["HIP_VISIBLE_DEVICES"] for launch in launches] == ["4", "5"]
    assert not any("ROCR_VISIBLE_DEVICES" in launch.env for launch in launches)


def test_plan_refuses_too_few_devices():
    with pytest.raises(ValueError):
        plan(options(dp=2), devices=["0"])


@pytest.mark.parametrize("env, detected, expected", [
    ({"HIP_VISIBLE_DEVICES": "2,3"}, 8, ["2", "3"]),
    ({"CUDA_VISIBLE_DEVICES": "5"}, 8, ["5"]),
    ({"ROCR_VISIBLE_DEVICES": "6,7"}, 8, ["6", "7"]),
    ({"ROCR_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "1,2"}, 8, ["5", "6"]),  # HIP indexes within ROCR
    ({"HIP_VISIBLE_DEVICES": ""}, 8, []),  # set but empty grants none, as for bisector's slots
    ({"ROCR_VISIBLE_DEVICES": "6,7", "CUDA_VISIBLE_DEVICES": ""}, 8, []),
    (gpu_env([6, 7]), 8, ["6", "7"]),
    ({}, 3, ["0", "1", "2"]),
])
def test_step_devices(env, detected, expected):
    assert step_devices(env, detected) == expected


def fake_sysfs(root, nodes):
    (root / "dev").mkdir(parents=True)
    (root / "dev/kfd").write_text("")
    for node, (simds, target) in enumerate(nodes):
        directory = root / f"sys/class/kfd/kfd/topology/nodes/{node}"
        directory.mkdir(parents=True)
        (directory / "properties").write_text(
            f"cpu_cores_count 0\nsimd_count {simds}\ngfx_target_version {target}\n")


def test_probe_finds_gpu_nodes_and_ignores_cpu_nodes(tmp_path):
    fake_sysfs(tmp_path, [(0, 0), (304, 90402), (256, 90500)])
    probe = probe_rocm_gpus(tmp_path)
    assert probe.problem is None
    assert probe.targets == ("gfx942", "gfx950")


def test_probe_without_kfd(tmp_path):
    assert probe_rocm_gpus(tmp_path).problem == "/dev/kfd missing"


def test_probe_with_only_cpu_nodes(tmp_path):
    fake_sysfs(tmp_path, [(0, 0)])
    assert probe_rocm_gpus(tmp_path).problem.startswith("no KFD node with SIMDs")


def test_gfx_names():
    assert [gfx_name(v) for v in (90402, 90500, 90010, 110000)] == ["gfx942", "gfx950", "gfx90a",
                                                                   "gfx1100"]


def test_child_engine_kwargs():
    args = child.parse_args(["--model", "/m", "--tp", "8", "--kv-cache-dtype", "fp8",
                             "--cudagraph-mode", "FULL_AND_PIECEWISE", "--max-num-seqs", "4",
                             "--max-model-len", "1024", "--gpu-memory-utilization", "0.5",
                             "--attention-backend", "ROCM_AITER_MLA", "--kv-cache-memory-bytes", "1024"])
    kwargs = child.engine_kwargs(args, {"model", "attention_backend", "kv_cache_memory_bytes"})
    assert kwargs["load_format"] == "dummy"
    assert kwargs["skip_tokenizer_init"] is True
    assert kwargs["kv_cache_dtype"] == "fp8"
    assert kwargs["tensor_parallel_size"] == 8
    assert kwargs["enforce_eager"] is False
    assert kwargs["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert kwargs["attention_backend"] == "ROCM_AITER_MLA"
    assert kwargs["kv_cache_memory_bytes"] == 1024
    assert not {"attention_backend", "kv_cache_memory_bytes"} & set(child.engine_kwargs(args, {"model"}))


def test_child_prompts_are_token_ids_inside_the_vocab():
    prompts = child.token_prompts(4, 4096)
    assert len(prompts) == 4
    assert len({len(prompt["prompt_token_ids"]) for prompt in prompts}) == 4
    assert all(1 < token < 4096 for prompt in prompts for token in prompt["prompt_token_ids"])
