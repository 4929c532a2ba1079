"""dpa-fp8-kv-graph-capture --option check=perf, end to end with the real child.py against the fake vllm of
test_dpa_fp8_kv_numerics.py (tests/fakes/vllm.py), whose engine steps here take a planted time (a planted
speed), every spike_every-th step spike_factor times that (planted noise)."""
import os
import statistics
import subprocess
import sys

import pytest
from fakes.vllm import CUDA_TORCH_FILES, fake_vllm, write_files
from test_dpa_fp8_kv_numerics import FAKE_VLLM, NAME, SMALL, nvidia_root  # noqa: F401

from bisector.errors import ScenarioError
from scenarios import create
from scenarios.base import StepContext, Verdict
from scenarios.dpa_fp8_kv import perf

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]

PERF = {**SMALL, "check": "perf", "perf_repeats": "3", "perf_tokens": "16", "perf_batch": "4"}


def measured(tmp_path, root, seconds_per_step: float, name: str, options=PERF, env=None, **fake):
    """One check=perf run of the fake vLLM whose engine steps take seconds_per_step (and `fake`'s knobs)."""
    site = write_files(tmp_path / "site", CUDA_TORCH_FILES)
    checkout = write_files(tmp_path / name / "tree", fake_vllm(
        **FAKE_VLLM, step_seconds=seconds_per_step, prompt_log=tmp_path / f"{name}-prompts.txt", **fake))
    scenario = create(NAME, options)
    scenario.system_root = root
    return scenario.run(StepContext(checkout=checkout, log_path=tmp_path / "logs" / f"{name}.log", timeout=120,
                                    python=sys.executable,
                                    env={"PYTHONPATH": str(site), "FAKE_VLLM_RECORD": str(tmp_path / "vllm.jsonl"),
                                         "BISECTOR_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}))


def test_check_perf_reports_decode_throughput_and_time_to_first_token(tmp_path, nvidia_root):  # noqa: F811
    fast = measured(tmp_path, nvidia_root, 0.002, "fast")
    assert fast.verdict is Verdict.GOOD, fast.reason
    assert set(fast.metrics) == {"decode_tok_s", "ttft_ms", "cpu_ms_per_step"}
    # 4 sequences per engine step of at least 2 ms (a sleep is never shorter; load only lengthens it): at most
    # 2,000 tokens/s; no lower bound, which a loaded machine could break
    assert 0 < fast.metrics["decode_tok_s"] <= 2000 * 1.02
    assert fast.metrics["ttft_ms"] >= 2
    found = fast.details["perf"]["measurements"]
    assert len(found) == 3  # three measurements inside one engine start
    for measurement in found:  # 17 engine steps (the prefill's and 16 decode), the first two not timed
        assert measurement["method"] == "engine-steps" and measurement["steps"] == 15
        assert measurement["step_ms_median"] >= 2 and measurement["step_ms_iqr"] >= 0
    slow = measured(tmp_path, nvidia_root, 0.008, "slow")  # 4x the step: slower even with ms of load on both
    assert slow.metrics["decode_tok_s"] < 0.75 * fast.metrics["decode_tok_s"]


def test_one_slow_step_in_ten_leaves_the_median_step_figure_where_it_was(tmp_path, nvidia_root):  # noqa: F811
    """Every tenth engine step 5x slower: the figure from the median step stays within a few % of the planted
    speed (4 sequences per 20 ms step: 200 tokens/s), where one from the mean step (the sum of the steps, as
    the two-generate difference measured) falls by a fifth or more."""
    options = {**PERF, "perf_tokens": "30"}
    noisy = measured(tmp_path, nvidia_root, 0.02, "noisy", options, spike_every=10, spike_factor=5)
    assert noisy.verdict is Verdict.GOOD, noisy.reason
    assert noisy.metrics["decode_tok_s"] <= 200 * 1.02  # never faster than the planted steps allow
    medians = [measurement["step_ms_median"] for measurement in noisy.details["perf"]["measurements"]]
    assert noisy.metrics["decode_tok_s"] == pytest.approx(statistics.median(4e3 / ms for ms in medians), rel=0.01)
    for measurement in noisy.details["perf"]["measurements"]:
        # the median step is the planted one and the quartiles leave the slow steps out (their spread stays under
        # the 80 ms a slow step adds, however much load lengthens every sleep); the mean carries the slow steps
        # (1.4x): a figure from it is a fifth lower or more (still with several ms of load added to every step)
        assert measurement["steps"] == 29 and measurement["step_ms_iqr"] < 80
        assert measurement["step_ms_mean"] > 1.2 * measurement["step_ms_median"]


def test_each_repeat_says_what_the_machine_did_meanwhile(tmp_path, nvidia_root):  # noqa: F811
    """Beside wall time, each repeat gives the CPU time per step of the engine's processes, the machine's steal
    time and the GPU's SM clock read while it decodes: a decode that burns its 10 ms steps on the CPU shows
    about 10 ms of CPU a step, one that waits (sleeps) through them far less."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(f"#!{sys.executable}\nimport sys\nprint('1980' if '--query-gpu=clocks.sm' in "
                                      f"sys.argv else 'unexpected')\n")
    (tools / "nvidia-smi").chmod(0o755)
    path = {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    busy = measured(tmp_path, nvidia_root, 0.01, "busy", env=path, busy=True)
    waiting = measured(tmp_path, nvidia_root, 0.01, "waiting", env=path)
    assert busy.verdict is waiting.verdict is Verdict.GOOD, (busy.reason, waiting.reason)
    for measurement in busy.details["perf"]["measurements"]:
        assert measurement["cpu_ms_per_step"] >= 9  # the CPU time the step spun (process time, not wall time)
        assert measurement["steal_ms"] >= 0 and measurement["sm_clock_mhz"] == 1980
    for measurement in waiting.details["perf"]["measurements"]:
        assert measurement["cpu_ms_per_step"] < 5 and measurement["step_ms_median"] >= 10
    # the run's metric is the median of its repeats', for `run --metric cpu_ms_per_step --lower-is-better`
    assert busy.metrics["cpu_ms_per_step"] >= 9 > 5 > waiting.metrics["cpu_ms_per_step"]


# a process whose child spins half a second of CPU, then whose threads start and end without pause
CHURNING_ENGINE = """
import subprocess, sys, threading
SPIN = ("import sys, time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass\\n"
        "print(flush=True)\\nsys.stdin.read()")
kid = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
kid.stdout.readline()
print(flush=True)
while True:
    threads = [threading.Thread(target=lambda: None) for _ in range(8)]
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
"""


def test_the_cpu_time_of_an_engine_whose_threads_come_and_go_is_always_read(tmp_path):
    """The CPU time of the engine's process tree is read while its threads start and end (an engine core's
    do): a thread that ends between the listing of the process's threads and the reading of its children is
    no error. CI saw a repeat lose its cpu_ms_per_step that way (a fifth of the reads failed before)."""
    from scenarios.dpa_fp8_kv.child import _tree_cpu_seconds
    churn = subprocess.Popen([sys.executable, "-c", CHURNING_ENGINE], stdout=subprocess.PIPE)
    try:
        churn.stdout.readline()  # its child has spun half a second of CPU, and its threads churn
        readings = [_tree_cpu_seconds(churn.pid) for _ in range(2000)]
    finally:
        churn.kill()
        churn.wait()
    assert None not in readings
    assert min(readings) >= 0.45  # the child's half second counts: the tree was walked
    assert _tree_cpu_seconds(churn.pid) is None  # a process that is gone has no figure


def test_long_prompts_and_more_layers_ask_for_a_gpu_bound_decode(tmp_path, nvidia_root):  # noqa: F811
    """perf_prompt_tokens sets the timed batch's prompt lengths (prompt n: perf_prompt_tokens + n tokens), so
    every decode step reads a long KV cache; layers deepens the model the child loads."""
    options = {**PERF, "perf_prompt_tokens": "300", "layers": "16", "max_model_len": "400"}
    long = measured(tmp_path, nvidia_root, 0.002, "long", options)
    assert long.verdict is Verdict.GOOD, long.reason
    lengths = [int(line) for line in (tmp_path / "long-prompts.txt").read_text().split()]
    assert lengths == [300, 301, 302, 303] * 3  # the batch of 4, once per repeat
    config = next((tmp_path / "cache" / "models").glob("*/config.json")).read_text()
    assert '"num_hidden_layers": 16' in config


def test_an_engine_without_step_is_measured_by_two_generates_and_says_so(tmp_path, nvidia_root):  # noqa: F811
    old = measured(tmp_path, nvidia_root, 0.002, "old", step_api=False)
    assert old.verdict is Verdict.GOOD, old.reason
    # a difference of two wall times: load on either generate moves it either way, so only its sign is certain
    assert old.metrics["decode_tok_s"] > 0
    assert {m["method"] for m in old.details["perf"]["measurements"]} == {"two-generates"}
    assert old.details["perf"]["method"] == "two-generates"


def test_check_perf_options_are_checked():
    with pytest.raises(ScenarioError, match="check=perf measures one engine: it needs dp=1"):
        create(NAME, {**PERF, "dp": "2"})
    with pytest.raises(ScenarioError, match="perf_batch=8: more than max_num_seqs=6"):
        create(NAME, {**PERF, "perf_batch": "8"})
    with pytest.raises(ScenarioError, match="needs max_model_len >= 1113"):
        create(NAME, {**PERF, "perf_tokens": "550"})
    with pytest.raises(ScenarioError, match="perf_prompt_tokens=1000 needs max_model_len >= 1037"):
        create(NAME, {**PERF, "perf_prompt_tokens": "1000"})
    with pytest.raises(ScenarioError, match="option layers=65: must be at most 64"):
        create(NAME, {**PERF, "layers": "65"})


def test_measurements_are_read_from_the_childs_lines_and_their_medians_reported():
    output = ('BISECTOR-PERF {"repeat": 0, "decode_tok_s": 900, "ttft_ms": 30}\nnoise\n'
              'BISECTOR-PERF {"repeat": 1, "decode_tok_s": 1100, "ttft_ms": 10}\nBISECTOR-PERF {broken\n'
              'BISECTOR-PERF {"repeat": 2, "decode_tok_s": 1000, "ttft_ms": 20}\n')
    values, details = perf.metrics(output)
    assert values == {"decode_tok_s": 1000.0, "ttft_ms": 20.0}
    assert len(details["perf"]["measurements"]) == 3
    assert perf.metrics("no measurement\n") == ({}, {})


@pytest.mark.unit
def test_a_repeat_without_a_decode_figure_keeps_its_time_to_first_token():
    """The child prints no decode_tok_s for a repeat whose longer generate was not slower (seen on the H200:
    a 1-token baseline gave 2e12 tokens/s): that repeat is left out of the decode median, not the TTFT's."""
    output = ('BISECTOR-PERF {"repeat": 0, "ttft_ms": 30}\n'
              'BISECTOR-PERF {"repeat": 1, "decode_tok_s": 1100, "ttft_ms": 10}\n'
              'BISECTOR-PERF {"repeat": 2, "decode_tok_s": 1000, "ttft_ms": 20}\n')
    values, details = perf.metrics(output)
    assert values == {"decode_tok_s": 1050.0, "ttft_ms": 20.0}
    assert details["perf"]["measurements"][0] == {"ttft_ms": 30.0}
