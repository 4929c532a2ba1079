"""check=numerics and the shared compile cache, end to end with the real child.py and real processes.

vLLM is replaced by a fake package in the checkout that behaves as the real one does where the scenario
depends on it: it logs the backend it selected and its compile-cache lines (keyed, like vLLM's, by the
model path, under VLLM_CACHE_ROOT), refuses a safetensors load without model.safetensors, and decodes
greedy tokens with top-k logprobs from the prompts — wrongly on the backend named by FAKE_BUG (the planted
bug). The seeded weights are written by the real generator with the real torch and safetensors.
"""
import hashlib
import json
import math
import sys
import textwrap
from pathlib import Path

import pytest

from bisector.builds.builder import NoBuild
from bisector.compile_cache import cache_root
from bisector.engine.judge import JudgeSpec
from bisector.engine.run import calibrate
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

FAKE_VLLM = {
    "vllm/__init__.py": '''
        import hashlib, json, os

        class SamplingParams:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

        class Logprob:
            def __init__(self, logprob):
                self.logprob = logprob

        class _Completion:
            def __init__(self, tokens, logprobs):
                self.token_ids, self.logprobs = tokens, logprobs

        class _Output:
            def __init__(self, completion):
                self.outputs = [completion]

        class _Engine:
            """The step API of vLLM's LLMEngine: a step makes one token of every unfinished request."""
            def __init__(self):
                self.remaining = {}

            def add_request(self, request_id, prompt, params):
                self.remaining[request_id] = params.kwargs["max_tokens"]

            def has_unfinished_requests(self):
                return bool(self.remaining)

            def step(self):
                self.remaining = {request: left - 1 for request, left in self.remaining.items() if left > 1}
                return []

        class LLM:
            def __init__(self, **kwargs):
                self.kwargs = kwargs
                self.llm_engine = _Engine()
                if kwargs["load_format"] == "safetensors" and not os.path.exists(
                        os.path.join(kwargs["model"], "model.safetensors")):
                    raise ValueError("Following weights were not initialized from checkpoint: {...}")
                if kwargs["attention_backend"] not in ("TRITON_MLA", "FLASHMLA"):
                    raise ValueError(f"Invalid attention backend: '{kwargs['attention_backend']}'")
                print(f"INFO Using AttentionBackendEnum.{kwargs['attention_backend']} backend.", flush=True)
                if not kwargs["enforce_eager"]:
                    self._compile()
                with open(os.environ["FAKE_VLLM_RECORD"], "a") as f:
                    f.write(json.dumps({"kwargs": kwargs, "env": {k: v for k, v in os.environ.items()
                                        if k.startswith(("VLLM_", "TRITON_", "TORCHINDUCTOR_"))}}) + "\\n")

            def _compile(self):
                key = hashlib.sha256(self.kwargs["model"].encode()).hexdigest()
                path = os.path.join(os.environ["VLLM_CACHE_ROOT"], "torch_compile_cache", "torch_aot_compile",
                                    key, "rank_0_0", "model")
                if os.path.exists(path) and os.environ.get("VLLM_DISABLE_COMPILE_CACHE") != "1":
                    print(f"INFO [decorators.py:312] Directly load AOT compilation from path {path}")
                    seconds = 0.81
                else:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    open(path, "w").write("compiled")
                    print("INFO [backends.py:393] Compiling a graph for compile range (1, 16384) takes 8.22 s")
                    print(f"INFO [decorators.py:708] saved AOT compiled function to {path}")
                    seconds = 10.03
                print(f"INFO [monitor.py:53] torch.compile took {seconds:.2f} s in total")
                print(f"INFO [core.py:337] init engine (profile, create kv cache, warmup model) took "
                      f"28.33 s (compilation: {seconds:.2f} s)", flush=True)

            def generate(self, prompts, params, use_tqdm=True):
                backend = self.kwargs["attention_backend"]
                buggy = (os.environ.get("FAKE_BUG") == backend or os.path.exists("BUG_" + backend)) \\
                    and not self.kwargs["enforce_eager"]
                results = []
                for n, prompt in enumerate(prompts):
                    seed = sum(prompt["prompt_token_ids"])
                    tokens = [(seed + 31 * t + (7 * t if buggy and t and n % 2 == 0 else 0)) % 4000 + 2
                              for t in range(params.kwargs["max_tokens"])]
                    logprobs = None
                    if params.kwargs.get("logprobs"):
                        logprobs = [{(token + r * (3 if buggy and n % 2 == 0 else 1)) % 4096:
                                     Logprob(-1.0 - 0.5 * r) for r in range(params.kwargs["logprobs"])}
                                    for token in tokens]
                    results.append(_Output(_Completion(tokens, logprobs)))
                return results
    ''',
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": '''
        from dataclasses import dataclass

        @dataclass
        class EngineArgs:
            model: str = ""
            attention_backend: str = ""
            kv_cache_memory_bytes: int = 0
    ''',
}
# A CUDA torch as the environment probe sees it (metadata and torch/version.py; nothing imports it).
FAKE_TORCH = {
    "torch/__init__.py": "",
    "torch/version.py": "__version__ = '2.11.0+cu130'\nhip = None\ncuda: Optional[str] = '13.0'\n",
    "torch-2.11.0+cu130.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cu130\n",
}


@pytest.fixture
def nvidia_root(tmp_path):
    root = tmp_path / "nvidia-root"
    (root / "dev").mkdir(parents=True)
    (root / "dev/nvidiactl").write_text("")
    gpu = root / "proc/driver/nvidia/gpus/0000:19:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text("Model: \t\t NVIDIA H200\n")
    return root


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache root for the module, its seeded model written once by the real generator."""
    root = tmp_path_factory.mktemp("shared-cache")
    settings = create(NAME, {**SMALL, "check": "numerics"}).settings
    prepare_model(root, settings, True, sys.executable)
    return root


def checkout_with_fake_vllm(path: Path) -> Path:
    for name, text in FAKE_VLLM.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(textwrap.dedent(text))
    return path


def step(tmp_path, nvidia_root, cache, options, name="step", env=None):
    """One scenario run in its own checkout (as a step of a run in its own worktree); the outcome and what
    the fake vLLM recorded of each engine."""
    site = tmp_path / "site"
    for rel, text in FAKE_TORCH.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    scenario = create(NAME, options)
    scenario.system_root = nvidia_root
    checkout = checkout_with_fake_vllm(tmp_path / name / "tree")
    record = tmp_path / name / "vllm.jsonl"
    ctx = StepContext(checkout=checkout, log_path=tmp_path / "logs" / f"{name}.log", timeout=120,
                      python=sys.executable,
                      env={"PYTHONPATH": str(site), "FAKE_VLLM_RECORD": str(record), "BISECTOR_CACHE_DIR": str(cache),
                           **(env or {})})
    outcome = scenario.run(ctx)
    engines = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
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
    assert "signature" not in outcome.details


def test_numerics_planted_bug_is_bad_with_its_own_signature_and_worst_sequences(tmp_path, nvidia_root,
                                                                                shared_cache):
    outcome, _ = step(tmp_path, nvidia_root, shared_cache, {**SMALL, "check": "numerics"},
                      env={"FAKE_BUG": "TRITON_MLA"})
    assert outcome.verdict is Verdict.BAD
    assert outcome.reason.startswith("numerics: TRITON_MLA disagrees with FLASHMLA on 3 of 6 sequences "
                                     "(token agreement 0.625")
    assert outcome.details["signature"] == numerics.SIGNATURE
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
    files = {name: textwrap.dedent(text) for name, text in FAKE_VLLM.items()}
    good = repo.commit("vllm", files)
    bad = repo.commit("the planted bug", {"BUG_TRITON_MLA": "merge half the splits\n"})
    site = tmp_path / "site"
    for rel, text in FAKE_TORCH.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
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
