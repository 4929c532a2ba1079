"""check=numerics and the shared compile cache, end to end with the real child.py and real processes.

vLLM is replaced by a fake package in the checkout (tests/fakes/vllm.py) that behaves as the real one does
where the scenario depends on it: it logs the backend it selected and its compile-cache lines (keyed, like vLLM's,
by the model path, under VLLM_CACHE_ROOT), refuses a safetensors load without model.safetensors, and decodes
greedy tokens with top-k logprobs from the prompts — wrongly on the backend named by FAKE_BUG (the planted
bug). The seeded weights are written by the real generator with the real torch and safetensors.
"""
import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
from fakes.machine import h200_machine
from fakes.vllm import CUDA_TORCH_FILES, fake_vllm, write_files

from bisector.builds.builder import NoBuild
from bisector.engine.judge import JudgeSpec
from bisector.engine.run import calibrate
from bisector.machine.compile_cache import cache_root
from scenarios import create
from scenarios.base import StepContext, Verdict
from scenarios.dpa_fp8_kv import numerics
from scenarios.dpa_fp8_kv.classify import compile_details
from scenarios.dpa_fp8_kv.config import deepseek_v3_config
from scenarios.dpa_fp8_kv.model import prepare_model
from scenarios.dpa_fp8_kv.weights import checkpoint_layout

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]

NAME = "dpa-fp8-kv-graph-capture"
SMALL = {"heads": "16", "max_num_seqs": "6", "platform": "cuda"}  # a small model: the weights take a second

# The fake vLLM as the numerics check meets it: two CUDA backends, compile-cache lines.
FAKE_VLLM = {"backends": ("TRITON_MLA", "FLASHMLA"), "compiles": True}


@pytest.fixture
def nvidia_root(tmp_path):
    return h200_machine(tmp_path / "nvidia-root")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache root for the module, its seeded model written once by the real generator."""
    root = tmp_path_factory.mktemp("shared-cache")
    settings = create(NAME, {**SMALL, "check": "numerics"}).settings
    prepare_model(root, settings, True, sys.executable)
    return root


def step(tmp_path, nvidia_root, cache, options, name="step", env=None):
    """One scenario run in its own checkout (as a step of a run in its own worktree); the outcome and what
    the fake vLLM recorded of each engine."""
    site = write_files(tmp_path / "site", CUDA_TORCH_FILES)
    scenario = create(NAME, options)
    scenario.system_root = nvidia_root
    checkout = write_files(tmp_path / name / "tree", fake_vllm(**FAKE_VLLM))
    record = tmp_path / name / "vllm.jsonl"
    ctx = StepContext(checkout=checkout, log_path=tmp_path / "logs" / f"{name}.log", timeout=120,
                      python=sys.executable,
                      env={"PYTHONPATH": str(site), "FAKE_VLLM_RECORD": str(record), "BISECTOR_CACHE_DIR": str(cache),
                           **(env or {})})
    outcome = scenario.run(ctx)
    lines = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    engines = [line for line in lines if "kwargs" in line]
    return outcome, engines


def test_two_steps_share_the_model_path_and_compile_cache_and_the_second_hits(tmp_path, nvidia_root):
    cache = tmp_path / "cache"
    first, (engine_1,) = step(tmp_path, nvidia_root, cache, SMALL, "step1")
    second, (engine_2,) = step(tmp_path, nvidia_root, cache, SMALL, "step2")
    assert first.verdict is second.verdict is Verdict.GOOD, (first.reason, second.reason)
    model = engine_1["kwargs"]["model"]
    assert engine_2["kwargs"]["model"] == model and Path(model).parent == cache / "models"
    assert json.loads((Path(model) / "config.json").read_text())["num_attention_heads"] == 16
    assert engine_1["env"]["VLLM_CACHE_ROOT"] == engine_2["env"]["VLLM_CACHE_ROOT"] == str(cache / "compile/vllm")
    assert engine_1["env"]["TRITON_CACHE_DIR"] == str(cache / "compile/triton")
    assert engine_1["env"]["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "compile/inductor")
    assert first.details["compile"] == {"cache": str(cache / "compile"), "cache_hit": False,
                                        "compile_seconds": 10.03, "engine_init_seconds": 28.33}
    assert second.details["compile"]["cache_hit"] is True and second.details["compile"]["compile_seconds"] == 0.81
    assert first.details["model"]["written_by_this_step"] and not second.details["model"]["written_by_this_step"]
    assert first.details["model"]["load_format"] == "dummy"

    changed, (engine_3,) = step(tmp_path, nvidia_root, cache, {**SMALL, "layers": "2"}, "step3")
    assert changed.verdict is Verdict.GOOD
    assert engine_3["kwargs"]["model"] != model and Path(engine_3["kwargs"]["model"]).parent == cache / "models"
    assert engine_3["env"]["VLLM_CACHE_ROOT"] == str(cache / "compile/vllm")
    assert changed.details["compile"]["cache_hit"] is False  # another model path: another cache entry
    assert not list((cache / "models").glob(".tmp/*"))


def test_compile_cache_off_gives_each_step_a_private_empty_cache(tmp_path, nvidia_root):
    cache = tmp_path / "cache"
    step(tmp_path, nvidia_root, cache, SMALL, "warm")
    outcome, (engine,) = step(tmp_path, nvidia_root, cache, {**SMALL, "compile_cache": "off"}, "off")
    assert outcome.verdict is Verdict.GOOD
    assert engine["env"]["VLLM_DISABLE_COMPILE_CACHE"] == "1"
    assert not engine["env"]["VLLM_CACHE_ROOT"].startswith(str(cache))
    assert outcome.details["compile"]["cache"] == "off" and outcome.details["compile"]["cache_hit"] is False
    assert not Path(engine["env"]["VLLM_CACHE_ROOT"]).exists()  # gone with the step's temporary dir


def test_numerics_clean_pair_is_good_with_figures_per_sequence(tmp_path, nvidia_root, shared_cache):
    outcome, engines = step(tmp_path, nvidia_root, shared_cache, {**SMALL, "check": "numerics"})
    assert outcome.verdict is Verdict.GOOD, outcome.reason
    assert outcome.reason.startswith("numerics: TRITON_MLA agrees with FLASHMLA (token agreement 1.000")
    assert sorted(engine["kwargs"]["attention_backend"] for engine in engines) == ["FLASHMLA", "TRITON_MLA"]
    assert all(engine["kwargs"]["load_format"] == "safetensors" for engine in engines)
    assert {engine["kwargs"]["model"] for engine in engines} == {outcome.details["model"]["dir"]}
    figures = outcome.details["numerics"]
    assert figures["sequences"] == 6 and figures["token_agreement"] == 1.0 and figures["topk_overlap"] == 1.0
    assert len(figures["per_sequence"]) == 6 and figures["disagreeing"] == 0
    assert outcome.details["reference"]["attention_backend"] == "FLASHMLA"
    assert outcome.details["model"]["weights"]["scale"] == 0.05
    assert outcome.signature is None


def test_numerics_planted_bug_is_bad_with_its_own_signature_and_worst_sequences(tmp_path, nvidia_root,
                                                                                shared_cache):
    outcome, _ = step(tmp_path, nvidia_root, shared_cache, {**SMALL, "check": "numerics"},
                      env={"FAKE_BUG": "TRITON_MLA"})
    assert outcome.verdict is Verdict.BAD
    assert outcome.reason.startswith("numerics: TRITON_MLA disagrees with FLASHMLA on 3 of 6 sequences "
                                     "(token agreement 0.625")
    assert outcome.signature == numerics.SIGNATURE
    worst = outcome.details["numerics"]["worst"]
    assert [seq["seq"] for seq in worst[:3]] == [0, 2, 4] and worst[0]["first_difference"] == 1
    log = Path(outcome.log_path).read_text()
    assert "===== worst: sequence 0: first different token at 1 of 4" in log
    assert "===== rank 1:" in log  # the reference engine's output is in the step's log too


def test_numerics_eager_reference_catches_what_only_graphs_get_wrong(tmp_path, nvidia_root, shared_cache):
    outcome, engines = step(tmp_path, nvidia_root, shared_cache,
                            {**SMALL, "check": "numerics", "reference": "eager"}, env={"FAKE_BUG": "TRITON_MLA"})
    assert outcome.verdict is Verdict.BAD
    assert sorted(engine["kwargs"]["enforce_eager"] for engine in engines) == [False, True]
    assert "disagrees with TRITON_MLA eager" in outcome.reason
    assert outcome.details["reference"]["compile"]["cache_hit"] is None  # eager compiles nothing


def test_check_crash_does_not_see_the_planted_bug(tmp_path, nvidia_root, shared_cache):
    outcome, engines = step(tmp_path, nvidia_root, shared_cache, SMALL, env={"FAKE_BUG": "TRITON_MLA"})
    assert outcome.verdict is Verdict.GOOD and len(engines) == 1
    assert engines[0]["kwargs"]["load_format"] == "dummy"  # the crash check runs as it always did


def test_reference_that_fails_is_a_skip_not_a_verdict(tmp_path, nvidia_root, shared_cache):
    outcome, _ = step(tmp_path, nvidia_root, shared_cache, {**SMALL, "check": "numerics", "reference": "NO_SUCH"})
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason.startswith("reference run (NO_SUCH) did not finish: ")


def test_reference_equal_to_the_run_under_test_is_refused(tmp_path, nvidia_root, shared_cache):
    outcome, engines = step(tmp_path, nvidia_root, shared_cache,
                            {**SMALL, "check": "numerics", "reference": "TRITON_MLA"})
    assert outcome.verdict is Verdict.SKIP and not engines
    assert outcome.reason == "option reference=TRITON_MLA: that is the run under test"


def test_calibrate_learns_the_bounds_from_the_good_ends_clean_pair(tmp_path, nvidia_root, shared_cache,
                                                                 make_repo, monkeypatch):
    repo = make_repo()
    good = repo.commit("vllm", fake_vllm(**FAKE_VLLM))
    bad = repo.commit("the planted bug", {"BUG_TRITON_MLA": "merge half the splits\n"})
    site = write_files(tmp_path / "site", CUDA_TORCH_FILES)
    for key, value in {"PYTHONPATH": str(site), "FAKE_VLLM_RECORD": str(tmp_path / "vllm.jsonl"),
                       "BISECTOR_CACHE_DIR": str(shared_cache)}.items():
        monkeypatch.setenv(key, value)
    scenario = create(NAME, {**SMALL, "check": "numerics"})
    scenario.system_root = nvidia_root
    judge = JudgeSpec(scenario, NoBuild(), 120, sys.executable)
    result = calibrate(repo.path, (good, bad), judge, runs=1, state_dir=tmp_path / "state")
    assert result.good["bad"] == 0 and result.bad["bad"] == 1
    assert result.signature == numerics.SIGNATURE
    assert result.options == {"min_token_agreement": "0.980", "min_topk_overlap": "0.980"}


def test_seeded_weights_are_deterministic_and_checked(tmp_path):
    settings = create(NAME, {**SMALL, "check": "numerics"}).settings
    first = prepare_model(tmp_path / "a", settings, True, sys.executable)
    second = prepare_model(tmp_path / "b", settings, True, sys.executable)
    assert first.path.name == second.path.name
    assert first.weights["sha256"] == second.weights["sha256"]
    data = (first.path / "model.safetensors").read_bytes()
    assert hashlib.sha256(data).hexdigest() == first.weights["sha256"]
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    layout = checkpoint_layout(deepseek_v3_config(settings))
    assert {name: list(shape) for name, shape, _ in layout} == \
        {name: spec["shape"] for name, spec in header.items() if name != "__metadata__"}
    assert all(header[name]["dtype"] == "BF16" for name, _, _ in layout)
    (first.path / "model.safetensors").write_bytes(data[:-2] + b"\0\0")
    with pytest.raises(Exception, match="does not match the sha256 in weights.json"):
        prepare_model(tmp_path / "a", settings, True, sys.executable)


def test_layout_is_deepseek_v3s_checkpoint_naming():
    config = deepseek_v3_config(create(NAME, {"layers": "2"}).settings)
    names = {name: (shape, fill) for name, shape, fill in checkpoint_layout(config)}
    assert names["model.layers.0.mlp.gate_proj.weight"][0] == (256, 1024)  # layer 0 dense
    assert names["model.layers.1.mlp.experts.7.down_proj.weight"][0] == (1024, 256)
    assert names["model.layers.1.mlp.gate.e_score_correction_bias"] == ((8,), "zeros")
    assert names["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"][0] == (576, 1024)
    assert names["model.layers.1.self_attn.q_b_proj.weight"][0] == (128 * 192, 512)
    assert names["model.layers.0.self_attn.kv_a_layernorm.weight"] == ((512,), "ones")
    assert "model.layers.0.mlp.experts.0.up_proj.weight" not in names


def test_compare_counts_agreement_until_the_first_difference():
    top = [[[5, -1.0], [6, -2.0]], [[7, -1.0], [8, -2.0]], [[9, -1.0], [10, -2.0]]]
    same = {"tokens": [5, 7, 9], "top": top}
    drifted = {"tokens": [5, 8, 9], "top": [top[0], [[8, -1.0], [7, -1.5]], [[11, -1.0], [12, -2.0]]]}
    result = numerics.compare([same, drifted], [same, same], topk=2)
    assert result.sequences[0] == {"seq": 0, "tokens": 3, "first_difference": None, "agreement": 1.0,
                                   "overlap": 1.0, "max_logprob_delta": 0.0}
    # positions 0 and 1 share a context; position 2 follows different tokens and is not compared
    assert result.sequences[1] == {"seq": 1, "tokens": 3, "first_difference": 1, "agreement": 0.3333,
                                   "overlap": 1.0, "max_logprob_delta": 1.0}
    assert result.token_agreement == pytest.approx((1 + 1 / 3) / 2)
    nan = {"tokens": [5], "top": [[[5, math.nan], [6, -2.0]]]}
    assert numerics.compare([nan], [same], topk=2).max_logprob_delta == math.inf
    with pytest.raises(ValueError, match="2 sequences against 1"):
        numerics.compare([same, same], [same], topk=2)


def test_calibrated_bounds_double_the_clean_pairs_distance_from_perfect():
    assert numerics.calibrated_bounds([{"token_agreement": 1.0, "topk_overlap": 0.998},
                                       {"token_agreement": 0.984, "topk_overlap": 0.99}]) == \
        {"min_token_agreement": "0.964", "min_topk_overlap": "0.970"}
    assert numerics.calibrated_bounds([]) == {}


def test_compile_details_from_the_h200_cold_log():
    text = (Path(__file__).parent / "records/h200-v024-triton-fp8-good.log").read_text()
    assert compile_details(text) == {"cache_hit": False, "compile_seconds": 10.03, "engine_init_seconds": 28.33}
    assert compile_details("no compile here") == {"cache_hit": None, "compile_seconds": None,
                                                  "engine_init_seconds": None}


def test_cache_root_follows_the_environment(tmp_path):
    assert cache_root({"BISECTOR_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_root({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "bisector"
    assert cache_root({"HOME": "/nowhere", "XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "bisector"
