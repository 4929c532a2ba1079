"""Options, the tiny DeepSeek-V3 config, the child launch plan and the GPU probe: pure parts."""
import json
from pathlib import Path

import pytest

from bisector.executor import gpu_env
from bisector.errors import ScenarioError
from scenarios import create
from scenarios.dpa_fp8_kv import child
from scenarios.dpa_fp8_kv.config import deepseek_v3_config, write_model_dir
from scenarios.dpa_fp8_kv.gpu import gfx_name, probe_rocm_gpus
from scenarios.dpa_fp8_kv.options import OPTION_DEFAULTS, parse_options
from scenarios.dpa_fp8_kv.plan import DEFAULT_TIMEOUT, build_plan, step_devices

pytestmark = [pytest.mark.unit, pytest.mark.gpu_plan]

NAME = "dpa-fp8-kv-graph-capture"


def options(**overrides):
    return parse_options({**OPTION_DEFAULTS, **{key: str(value) for key, value in overrides.items()}})


def plan(opts, devices=("0", "1", "2", "3", "4", "5", "6", "7"), base_env=None, timeout=None):
    return build_plan(opts, python="/venv/bin/python", child_script=Path("/tmp/w/child.py"),
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
    ({"layers": "3"}, "option layers=3: must be 1 or 2"),
    ({"heads": "128", "tp": "3"}, "option heads=128 is not divisible by tp=3"),
    ({"kv_cache_dtype": "int8"}, "option kv_cache_dtype='int8': must be one of"),
    ({"cudagraph_mode": "PIECEWISE"}, "option cudagraph_mode='PIECEWISE': must be one of"),
    ({"gpu_memory_utilization": "1.5"}, "option gpu_memory_utilization=1.5: must be in (0, 1]"),
    ({"max_model_len": "16"}, "option max_model_len=16: must be at least 64"),
    ({"batch": "4"}, "has no option 'batch'"),
])
def test_bad_options_are_one_line_errors(raw, message):
    with pytest.raises(ScenarioError) as err:
        create(NAME, raw)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_config_has_the_mla_shapes_aiter_requires(tmp_path):
    path = write_model_dir(tmp_path / "model", options(layers=2))
    config = json.loads(path.read_text())
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
                           "--max-num-seqs", "4", "--max-model-len", "1024",
                           "--gpu-memory-utilization", "0.5"]
    assert launch.env["VLLM_ROCM_USE_AITER"] == "1"
    assert launch.env["VLLM_ROCM_USE_AITER_MLA"] == "1"
    assert launch.env["HIP_VISIBLE_DEVICES"] == launch.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert launch.env["PYTHONPATH"] == "/src/vllm:/extra"
    assert launch.env["PATH"] == "/usr/bin"
    assert not any(key.startswith("VLLM_DP_") for key in launch.env)  # a stray DP env is dropped
    assert launch.timeout == DEFAULT_TIMEOUT


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
                             "--max-model-len", "1024", "--gpu-memory-utilization", "0.5"])
    kwargs = child.engine_kwargs(args, {"model", "attention_backend"})
    assert kwargs["load_format"] == "dummy"
    assert kwargs["skip_tokenizer_init"] is True
    assert kwargs["kv_cache_dtype"] == "fp8"
    assert kwargs["tensor_parallel_size"] == 8
    assert kwargs["enforce_eager"] is False
    assert kwargs["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert kwargs["attention_backend"] == "ROCM_AITER_MLA"
    assert "attention_backend" not in child.engine_kwargs(args, {"model"})


def test_child_prompts_are_token_ids_inside_the_vocab():
    prompts = child.token_prompts(4, 4096)
    assert len(prompts) == 4
    assert len({len(prompt["prompt_token_ids"]) for prompt in prompts}) == 4
    assert all(1 < token < 4096 for prompt in prompts for token in prompt["prompt_token_ids"])
