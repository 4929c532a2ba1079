"""Where a step's seconds go: `phases` in each step's details, on real runs.

A command run through the real CLI on a real repository (its JSON and `report --format json`), and the GPU
scenario's own parts timed from the marks its real child.py prints, over the fake vLLM
(tests/fakes/vllm.py) slowed where vLLM is slow (its import, its engine start).
"""
import json
import sys
import threading
import time

import pytest
from fakes.vllm import CUDA_TORCH_FILES, fake_vllm, write_files
from test_dpa_fp8_kv_numerics import FAKE_VLLM, NAME, SMALL, nvidia_root  # noqa: F401
from test_images import bisect, docker, history, publish  # noqa: F401

from scenarios import create
from scenarios.base import StepContext, Verdict

pytestmark = pytest.mark.integration

PAUSE = 0.3  # what each slowed part sleeps: a lower bound its phase must show


def assert_adds_up(step: dict) -> None:
    """The step's phases sum to its seconds within rounding, and what no part covers is the last, "other"."""
    phases = step["details"]["phases"]
    assert list(phases)[-1] == "other", phases
    assert all(seconds >= 0 for seconds in phases.values()), phases
    assert abs(sum(phases.values()) - step["seconds"]) <= 0.01, (phases, step["seconds"])


def test_every_step_of_a_command_run_says_where_its_seconds_went(make_repo, cli, tmp_path):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    out, state = tmp_path / "out.json", tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--repeat", "2", "--json", str(out), "--", "sh", "-c", f"sleep {PAUSE}; grep -q good state")
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(out.read_text())["steps"]
    assert {step["verdict"] for step in steps} == {"good", "bad"}
    for step in steps:
        phases = step["details"]["phases"]
        assert list(phases) == ["worktree", "environment", "world", "machine_check", "build", "scenario",
                                "other"], phases  # as they ran
        assert_adds_up(step)
        runs = 2 if step["verdict"] == "good" else 1  # --repeat 2: a good is two runs, both counted
        assert phases["scenario"] >= runs * PAUSE, phases
    report = cli("report", "latest", "--repo", str(repo.path), "--state-dir", str(state), "--format", "json")
    stored = json.loads(report.stdout)["steps"]
    assert [step["details"]["phases"] for step in stored] == [step["details"]["phases"] for step in steps]


def test_an_image_step_says_how_long_its_pull_and_proof_took(make_repo, docker, tmp_path, cli,  # noqa: F811
                                                            wait_for):
    repo, shas = history(make_repo, count=3, culprit=2)
    publish(docker, shas, range(3), culprit=2, local={0})  # the good end's image is here; the bad end's pulled
    gate = tmp_path / "pull-gate"  # a pull waits until it exists: opened PAUSE after the first pull began
    docker.env["FAKE_DOCKER_PULL_GATE"] = str(gate)

    def open_gate_late():
        if wait_for(lambda: any(call[:1] == ["pull"] for call in docker.calls())):
            time.sleep(PAUSE)
        gate.touch()

    opener = threading.Thread(target=open_gate_late)
    opener.start()
    try:
        run = bisect(cli, repo, shas, tmp_path / "state", docker, json_file=tmp_path / "r.json")
    finally:
        gate.touch()
        opener.join()
    assert run.returncode == 0, run.stderr
    steps = {step["sha"]: step for step in json.loads((tmp_path / "r.json").read_text())["steps"]}
    assert set(steps) == set(shas)
    for sha in shas:
        phases = steps[sha]["details"]["phases"]
        assert list(phases) == ["worktree", "environment", "image_pull", "image_proof", "world", "scenario",
                                "other"], phases  # the image holds the build: no build part
        assert_adds_up(steps[sha])
    # the first pull waited at the gate (the good end's image was here: no pull)
    assert max(steps[sha]["details"]["phases"]["image_pull"] for sha in shas[1:]) >= PAUSE


@pytest.mark.parametrize("options, work", [
    (SMALL, "decode"),
    ({**SMALL, "check": "perf", "perf_repeats": "1", "perf_tokens": "4", "perf_batch": "2"}, "measure")])
def test_gpu_scenario_times_its_child_from_the_marks_it_prints(tmp_path, nvidia_root, options, work):  # noqa: F811
    site = write_files(tmp_path / "site", CUDA_TORCH_FILES)
    checkout = write_files(tmp_path / "tree", fake_vllm(**FAKE_VLLM, start_pause=PAUSE))  # its import, its start
    scenario = create(NAME, options)
    scenario.system_root = nvidia_root
    ctx = StepContext(checkout=checkout, log_path=tmp_path / "logs" / "step.log", timeout=120, python=sys.executable,
                      env={"PYTHONPATH": str(site), "FAKE_VLLM_RECORD": str(tmp_path / "vllm.jsonl"),
                           "BISECTOR_CACHE_DIR": str(tmp_path / "cache")})
    outcome = scenario.run(ctx)
    assert outcome.verdict is Verdict.GOOD, outcome.reason
    phases = outcome.phases
    assert [name for name in phases if name != "start_gate"] == \
        ["probe", "prepare", "child_start", "import_torch", "import", "engine", work, "shutdown"], phases
    assert phases["import"] >= PAUSE and phases["engine"] >= PAUSE, phases  # where the fake vLLM slept
    assert all(seconds >= 0 for seconds in phases.values()), phases
    child = sum(seconds for name, seconds in phases.items() if name not in ("probe", "prepare"))
    assert child <= outcome.details["seconds"] + 0.1, (phases, outcome.details["seconds"])  # the ranks' own time
