"""The compile cache and check=numerics on real outputs: vLLM 0.24.0 on an NVIDIA H200 (tests/records/,
2026-12-01). The logs are judged again by today's code; the run records are checked for what they claim."""
import json
import sys

import pytest
from dpa_fp8_kv_records import RECORDS_DIR, recorded

from bisector.process import ProcessResult
from scenarios import create
from scenarios.base import Verdict
from scenarios.dpa_fp8_kv import numerics
from scenarios.dpa_fp8_kv.classify import classify, compile_details
from scenarios.dpa_fp8_kv.model import prepare_model

pytestmark = pytest.mark.integration


def record(name: str) -> dict:
    return json.loads((RECORDS_DIR / name).read_text())


def ranks(name: str) -> tuple[dict, list[str]]:
    """A numerics log's provenance and its two engines' outputs (run under test, reference)."""
    provenance, output = recorded(name)
    test, _, reference = output.partition("===== rank 1:")
    return provenance, [test, reference]


@pytest.mark.parametrize("name, expected", [
    ("h200-v024-compile-cold", {"cache_hit": False, "compile_seconds": 14.61, "engine_init_seconds": 34.46}),
    ("h200-c12-compile-recompiled", {"cache_hit": False, "compile_seconds": 2.65, "engine_init_seconds": None}),
    ("h200-c9-compile-cache-hit", {"cache_hit": True, "compile_seconds": 1.01, "engine_init_seconds": None}),
])
def test_compile_lines_of_real_steps(name, expected):
    provenance, output = recorded(name)
    assert {"vllm", "gpu", "date", "command", "exit", "what"} <= set(provenance)
    assert compile_details(output) == expected
    assert "/tmp/bcache/models/b1417818896fe07e" in output  # every step: the same content-addressed model dir


def test_the_compile_cache_bisection_names_c8_with_every_later_compile_under_3s():
    run = record("h200-bisect-compile-cache.json")
    history = record("h200-history.json")
    assert run["culprit"]["sha"] == next(c["sha"] for c in history if c["role"] == "planted-fault")
    steps = run["steps"]
    assert [step["verdict"] for step in steps] == ["good", "bad", "skip", "skip", "good", "bad", "bad"]
    compiled = [step["details"]["compile"]["compile_seconds"] for step in steps]
    assert compiled[0] == 14.61
    assert all(seconds <= 3 for seconds in compiled[1:] if seconds is not None)
    assert len([s for s in compiled[1:] if s is not None]) == 4  # the two import-error skips compile nothing
    assert {step["details"]["model"]["dir"] for step in steps} == {"/tmp/bcache/models/b1417818896fe07e"}
    before = record("h200-bisect-final.json")
    assert [step["sha"] for step in before["steps"]] == [step["sha"] for step in steps]


def test_clean_v024_agrees_with_flashmla_and_with_eager_on_the_seeded_checkpoint():
    pair = record("h200-v024-numerics-triton-vs-flashmla.json")["details"]
    assert pair["model"]["load_format"] == "safetensors"
    assert pair["model"]["weights"]["tensors"] == 41 and pair["model"]["weights"]["scale"] == 0.05
    figures = pair["numerics"]
    assert (figures["token_agreement"], figures["topk_overlap"]) == (0.8828, 0.955)
    assert numerics.calibrated_bounds([figures]) == {"min_token_agreement": "0.766", "min_topk_overlap": "0.910"}
    for name, backend in (("h200-v024-numerics-triton-vs-eager.json", "TRITON_MLA"),
                          ("h200-v024-numerics-flashmla-vs-eager.json", "FLASHMLA")):
        run = record(name)
        assert run["verdict"] == "good"
        assert run["reason"].startswith(f"numerics: {backend} agrees with {backend} eager")
        assert run["details"]["reference"]["enforce_eager"] is True
        assert run["details"]["numerics"]["token_agreement"] > 0.95


def test_the_default_bounds_hold_for_the_measured_clean_pair():
    defaults = create("dpa-fp8-kv-graph-capture", {}).settings
    clean_pair = record("h200-v024-numerics-triton-vs-flashmla.json")["details"]["numerics"]
    calibrated = numerics.calibrated_bounds([clean_pair])
    assert defaults.min_token_agreement <= float(calibrated["min_token_agreement"])
    assert defaults.min_topk_overlap <= float(calibrated["min_topk_overlap"])


@pytest.mark.parametrize("name, agrees, figures", [
    ("h200-v024-numerics-good", True, (0.8828, 0.955)),
    ("h200-s5-numerics-bad", False, (0.2734, 0.5761)),
])
def test_real_decode_records_compare_as_recorded(name, agrees, figures):
    provenance, (test, reference) = ranks(name)
    assert classify(ProcessResult(0, False, 1.0, test), ("cuda",), ("TRITON_MLA",))[0] is Verdict.GOOD
    assert classify(ProcessResult(0, False, 1.0, reference), ("cuda",), ("FLASHMLA",))[0] is Verdict.GOOD
    comparison = numerics.compare(numerics.decoded(test), numerics.decoded(reference), 20)
    assert (round(comparison.token_agreement, 4), round(comparison.topk_overlap, 4)) == figures
    assert numerics.judge(comparison, 0.766, 0.91, "TRITON_MLA", "FLASHMLA")[0] is agrees
    assert numerics.judge(comparison, 0.75, 0.9, "TRITON_MLA", "FLASHMLA")[0] is agrees  # the defaults
    assert compile_details(test)["cache_hit"] is True and compile_details(reference)["cache_hit"] is True
    assert "Loading weights took" in test  # vLLM's strict loader: every parameter came from the checkpoint


def test_the_silent_bug_bisects_to_s5_with_numerics_and_is_good_under_check_crash():
    run = record("h200-bisect-numerics.json")
    culprit = next(c for c in record("h200-history-silent.json") if c["role"] == "silent-bug")
    assert run["culprit"]["sha"] == culprit["sha"]
    assert run["signature"]["signature"] == numerics.SIGNATURE
    assert [step["verdict"] for step in run["steps"]] == ["good", "bad", "good", "bad", "bad"]
    for step in run["steps"]:
        assert step["details"]["compile"]["cache_hit"] is True
        assert step["details"]["reference"]["compile"]["cache_hit"] is True
        assert len(step["details"]["numerics"]["per_sequence"]) == 64
    crash = record("h200-s5-silent-bug-check-crash.json")
    assert crash["sha"] == culprit["sha"] and crash["verdict"] == "good"
    provenance, output = recorded("h200-s5-check-crash-good")
    assert classify(ProcessResult(0, False, 1.0, output), ("cuda",), ("TRITON_MLA",))[0] is Verdict.GOOD


@pytest.mark.slow
def test_the_generator_writes_the_same_checkpoint_here_as_on_the_h200(tmp_path):
    """torch 2.11.0+cu130 there, this venv's CPU torch here: the same bytes (per-tensor seeded generators)."""
    recorded_weights = record("h200-v024-numerics-triton-vs-flashmla.json")["details"]["model"]["weights"]
    settings = create("dpa-fp8-kv-graph-capture", {"check": "numerics", "platform": "cuda",
                                                   "max_num_seqs": "64"}).settings
    model = prepare_model(tmp_path, settings, True, sys.executable)
    assert model.weights["sha256"] == recorded_weights["sha256"]


@pytest.mark.parametrize("name, expected", [
    ("h200-c7-compile-cache-off", {"cache_hit": False, "compile_seconds": 20.55, "engine_init_seconds": 40.47}),
    ("h200-c7-compile-cache-on", {"cache_hit": False, "compile_seconds": 2.67, "engine_init_seconds": 10.05}),
    ("h200-c9-compile-cache-off", {"cache_hit": False, "compile_seconds": 19.08, "engine_init_seconds": None}),
])
def test_compile_cache_off_and_on_on_one_machine(name, expected):
    provenance, output = recorded(name)
    assert compile_details(output) == expected
    off = "compile_cache=off" in provenance["command"]
    assert ("vLLM's torch.compile cache is disabled." in output) is off
    assert ("/tmp/bcache/compile" in output) is not off


def test_same_machine_steps_with_the_cache_take_under_half_the_time():
    runs = record("h200-compile-cache-same-machine.json")["runs"]
    for commit in ("c7", "c9"):
        first = 1 if commit == "c7" else 3
        off, on = runs[f"r{first}-{commit}-off"], runs[f"r{first + 1}-{commit}-on"]
        assert off["sha"] == on["sha"] and off["verdict"] == on["verdict"]
        assert on["seconds"] < off["seconds"] / 2
        assert off["details"]["compile"]["cache"] == "off"
        assert on["details"]["compile"]["compile_seconds"] <= 3
