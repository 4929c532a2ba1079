"""Classification of recorded-style child outputs, and the verdict across DP ranks. Pure."""
import pytest

from bisector.process import ProcessResult
from scenarios.base import Verdict
from scenarios.dpa_fp8_kv.classify import classify, combine

pytestmark = pytest.mark.unit


@pytest.fixture
def result(child_output):
    """result(record name, ...) -> the ProcessResult of a child that printed that record."""
    def make(record, returncode=1, timed_out=False, seconds=12.0):
        return ProcessResult(returncode, timed_out, seconds, child_output.records[record])

    return make


def test_fault_during_capture_is_bad_quoting_the_lines(child_output, result):
    verdict, reason = classify(result("fault-in-capture", returncode=-6))
    assert verdict is Verdict.BAD
    assert reason == f"GPU memory fault during engine start-up/graph capture: {child_output.fault}"


def test_fault_behind_engine_core_failure_is_bad_with_all_fault_lines(child_output, result):
    verdict, reason = classify(result("fault-then-engine-failed", returncode=1))
    assert verdict is Verdict.BAD
    assert reason == ("GPU memory fault during engine start-up/graph capture: "
                      f"{child_output.fault} | {child_output.hsa}")


def test_fault_after_the_engine_was_ready_is_a_decode_fault(result):
    verdict, reason = classify(result("fault-in-decode", returncode=134))
    assert verdict is Verdict.BAD
    assert reason.startswith("GPU memory fault during decode: Memory access fault by GPU node-2")


def test_engine_core_sigabrt_without_fault_lines_is_bad(child_output, result):
    verdict, reason = classify(result("core-abort", returncode=1))
    assert verdict is Verdict.BAD
    assert reason == ("SIGABRT during engine start-up/graph capture: "
                      "Failed core proc(s): {'EngineCore_DP0': -6}")
    assert child_output.engine_failed.endswith(reason.split(": ", 1)[1])


@pytest.mark.parametrize("returncode", [-6, 134])
def test_child_sigabrt_is_bad(returncode, child_output):
    verdict, reason = classify(ProcessResult(returncode, False, 3.0,
                                             child_output.records["ok-without-aiter"][:20]))
    assert verdict is Verdict.BAD
    assert reason == f"SIGABRT during engine start-up/graph capture: exit {returncode}"


def test_marker_on_aiter_mla_is_good(result):
    verdict, reason = classify(result("ok", returncode=0))
    assert verdict is Verdict.GOOD
    assert reason.endswith("BISECTOR-SCENARIO-OK dp_rank=0 sequences=4 tokens=8")


def test_marker_is_good_even_when_teardown_is_killed(result):
    assert classify(result("ok", returncode=None))[0] is Verdict.GOOD


def test_marker_without_aiter_mla_is_skip(result):
    verdict, reason = classify(result("ok-without-aiter", returncode=0))
    assert verdict is Verdict.SKIP
    assert "never names the AITER MLA backend" in reason


@pytest.mark.parametrize("record, expected", [
    ("import-error", "import error: ModuleNotFoundError: No module named 'aiter'"),
    ("undefined-symbol", "build problem: ImportError: /src/vllm/vllm/_C.abi3.so: undefined symbol: "
                         "_ZN3c104cuda9SetDeviceEa"),
    ("oom", "out of GPU memory: torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 191.98 GiB"),
    ("no-gpu", "no GPU: RuntimeError: No HIP GPUs are available"),
    ("other-error", "exit 1 before the marker: ValueError: unsupported cudagraph_mode FULL"),
])
def test_failures_before_the_marker_are_skips_with_precise_reasons(record, expected, result):
    assert classify(result(record)) == (Verdict.SKIP, expected)


def test_timeout_is_skip(child_output):
    verdict, reason = classify(ProcessResult(None, True, 3600.4,
                                             child_output.records["ok"].split("BISECTOR")[0]))
    assert (verdict, reason) == (Verdict.SKIP, "timed out after 3600s during engine start-up/graph capture")


def test_silent_exit_is_skip():
    assert classify(ProcessResult(0, False, 1.0, "")) == (Verdict.SKIP,
                                                          "exit 0 before the marker: no output")


def judge(*results):
    results = list(results)
    return combine(results, [classify(r) for r in results])


def test_one_bad_rank_makes_the_step_bad(child_output, result):
    stopped = ProcessResult(None, False, 40.0, "INFO waiting")
    assert judge(stopped, result("fault-in-capture", -6)) == (
        Verdict.BAD,
        f"DP rank 1: GPU memory fault during engine start-up/graph capture: {child_output.fault}")


def test_all_good_ranks(result):
    verdict, reason = judge(result("ok", 0), result("ok", 0))
    assert verdict is Verdict.GOOD
    assert reason.startswith("all 2 DP ranks: graph capture and a decode step finished on AITER MLA")


def test_skip_reason_comes_from_the_rank_that_failed_not_the_one_stopped(result):
    stopped = ProcessResult(None, False, 40.0, "INFO waiting")
    assert judge(stopped, result("oom")) == (
        Verdict.SKIP, "DP rank 1: out of GPU memory: torch.OutOfMemoryError: HIP out of memory. Tried "
                      "to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB")


def test_single_rank_reason_has_no_rank_prefix(result):
    assert judge(result("no-gpu")) == (Verdict.SKIP, "no GPU: RuntimeError: No HIP GPUs are available")
