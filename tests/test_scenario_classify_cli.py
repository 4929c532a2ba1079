"""`bisector scenario classify`: the verdict a scenario gives a saved child output, through the CLI."""
import json

import pytest
from dpa_fp8_kv_records import APERTURE, FAULT, HSA, RECORDS

NAME = "dpa-fp8-kv-graph-capture"
pytestmark = pytest.mark.integration


@pytest.fixture
def classify(tmp_path, cli):
    """classify(record, *args) -> `bisector scenario classify` on that saved record."""
    def run(record: str, *args: str):
        log = tmp_path / "child.log"
        log.write_text(RECORDS[record])
        return cli("scenario", "classify", NAME, "--log", str(log), *args)
    return run


@pytest.mark.parametrize("record, exit_code, code, start", [
    ("fault-in-capture", "-6", 1, f"bad: GPU memory fault during engine start-up/graph capture: {FAULT}"),
    ("aperture", "1", 1, f"bad: GPU memory fault during engine start-up/graph capture: {APERTURE}"),
    ("lone-0x1016", "-6", 125, f"skip: hardware exception, not a memory fault: {HSA}"),
    ("oom", "1", 125, "skip: out of GPU memory: torch.OutOfMemoryError: HIP out of memory."),
    ("ok-then-teardown-abort", "-6", 0, "good: graph capture and a decode step finished on ROCM_AITER_MLA"),
])
def test_verdicts_of_saved_logs(tmp_path, record, exit_code, code, start, classify):
    done = classify(record, "--option", "platform=rocm", "--exit-code", exit_code)
    assert done.returncode == code, done.stderr
    assert done.stdout.startswith(start)


def test_json_names_the_matched_lines(tmp_path, classify):
    done = classify("fault-then-engine-failed", "--exit-code", "1", "--json")
    outcome = json.loads(done.stdout)
    assert outcome["verdict"] == "bad"
    assert outcome["details"]["platforms"] == ["rocm", "cuda"]  # auto: the log's origin is unknown
    assert outcome["details"]["matched"][0] == FAULT
    assert HSA in outcome["details"]["matched"]


def test_a_killed_child_is_reported_by_its_signal(tmp_path, classify):
    done = classify("loading", "--exit-code", "-9", "--option", "platform=cuda")
    assert (done.returncode, done.stdout.strip()) == (
        125, "skip: killed by SIGKILL from outside (OOM killer?) during engine start-up/graph capture: no verdict; "
             "INFO 05-20 10:00:03 [default_loader.py:267] Loading weights took 0.52 seconds")


@pytest.mark.parametrize("args, message", [
    (("--option", "platform=tpu"), "option platform='tpu': must be one of auto, rocm, cuda"),
    (("--option", "nonsense"), "--option takes KEY=VALUE"),
])
def test_bad_input_is_one_line_error(tmp_path, args, message, classify):
    done = classify("ok", *args)
    assert done.returncode == 2
    assert done.stderr.strip() == f"bisector: error: {message}" or message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_scenario_without_a_log_classifier_is_an_error(tmp_path, cli, classify):
    log = tmp_path / "child.log"
    log.write_text("x\n")
    done = cli("scenario", "classify", "aiter-mla-probe", "--log", str(log))
    assert (done.returncode, done.stderr.strip()) == (
        2, "bisector: error: scenario 'aiter-mla-probe' cannot judge a saved log")
