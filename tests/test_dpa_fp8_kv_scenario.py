"""The scenario end to end with real child processes: a fake python replaying child outputs (public
quotes, see dpa_fp8_kv_records.py), the real child.py against a fake vllm package, and a fake /dev, /sys
and /proc tree for the GPU check."""
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from dpa_fp8_kv_records import FAULT, RECORDS
from fakes.machine import h200_machine, mi300x_machine
from fakes.vllm import CUDA_TORCH_FILES, ROCM_TORCH_FILES, fake_vllm, write_files

from bisector.process import Cancelled
from scenarios import create
from scenarios.base import StepContext, Verdict
from scenarios.dpa_fp8_kv import launch

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]

NAME = "dpa-fp8-kv-graph-capture"
ROCM_TORCH = json.dumps({"torch": "2.9.0+rocm7.0", "transformers": "4.57.1", "torch_hip": "7.0.51831",
                         "torch_cuda": None})
CUDA_TORCH = json.dumps({"torch": "2.11.0+cu130", "transformers": "5.17.0", "torch_hip": None,
                         "torch_cuda": "13.0"})

FAKE_PYTHON = f"""#!{sys.executable}
# Stands in for the user's python: answers the environment probe (bisector/machine/probe_env.py) from
# FAKE_ENVIRONMENT_FILE or FAKE_ENVIRONMENT (site directories: FAKE_SITES; one line per probe appended to
# FAKE_PROBE_LOG), else says it was launched, waits at the real child's start gate when given one, records
# what it was given, replays FAKE_OUTPUT_<rank>, then acts.
import json, os, subprocess, sys, time
if sys.argv[1].endswith("probe_env.py"):
    if "FAKE_PROBE_LOG" in os.environ:
        open(os.environ["FAKE_PROBE_LOG"], "a").write("probe\\n")
    written = os.environ.get("FAKE_ENVIRONMENT_FILE")
    found = json.loads(open(written).read() if written and os.path.exists(written)
                       else os.environ.get("FAKE_ENVIRONMENT", {ROCM_TORCH!r}))
    sites = [site for site in os.environ.get("FAKE_SITES", "").split(os.pathsep) if site]
    print(json.dumps({{"python": "3.12.3", "executable": sys.executable, "prefix": sys.prefix, "sites": sites,
                      "purelib": "", "versions": {{name: found.get(name) for name in sys.argv[2:]}},
                      "torch": {{"origin": None, "hip": found["torch_hip"], "cuda": found["torch_cuda"]}}}}))
    sys.exit(0)
rank = os.environ.get("VLLM_DP_RANK", "0")
open(os.path.join(os.environ["FAKE_RECORD_DIR"], "launched" + rank), "w").close()
if "--start-gate" in sys.argv:  # the real child's gate, where the child waits: after its imports
    sys.path.insert(0, os.path.dirname(sys.argv[1]))
    import child
    child.pass_start_gate(sys.argv[sys.argv.index("--start-gate") + 1])
model = sys.argv[sys.argv.index("--model") + 1]
with open(os.path.join(os.environ["FAKE_RECORD_DIR"], "rank" + rank + ".json"), "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(),
               "config": json.load(open(os.path.join(model, "config.json")))}}, f)
print(os.environ.get("FAKE_OUTPUT_" + rank, ""), file=sys.stderr, flush=True)
action = os.environ.get("FAKE_ACTION_" + rank, "exit 0")
if action == "abort":
    os.abort()
if action == "hang":  # with a grandchild, as an engine core would be
    core = subprocess.Popen(["sleep", "600"])
    open(os.path.join(os.environ["FAKE_RECORD_DIR"], "core" + rank + ".pid"), "w").write(str(core.pid))
    time.sleep(600)
sys.exit(int(action.split()[1]))
"""


@pytest.fixture
def gpu_root(tmp_path):
    """A fake / with /dev/kfd and a CPU node plus two MI300X (gfx942) GPU nodes."""
    return mi300x_machine(tmp_path / "root")


@pytest.fixture
def fake_python(tmp_path):
    path = tmp_path / "bin/python"
    path.parent.mkdir()
    path.write_text(FAKE_PYTHON)
    path.chmod(0o755)
    return path


@pytest.fixture
def records(tmp_path):
    path = tmp_path / "records"
    path.mkdir()
    return path


def run(tmp_path, root, python, options=None, env=None, timeout=60):
    scenario = create(NAME, options or {})
    scenario.system_root = root
    checkout = tmp_path / "checkout"
    checkout.mkdir(exist_ok=True)
    ctx = StepContext(checkout=checkout, log_path=tmp_path / "logs/step.log", timeout=timeout,
                      env=env or {}, python=str(python))
    return scenario.run(ctx)


def replay(records, **per_rank):
    """ctx.env making the fake python replay RECORDS[name] and then act, per rank."""
    env = {"FAKE_RECORD_DIR": str(records)}
    for rank, (record, action) in per_rank.items():
        env[f"FAKE_OUTPUT_{rank[-1]}"] = RECORDS[record]
        env[f"FAKE_ACTION_{rank[-1]}"] = action
    return env


@pytest.fixture
def nvidia_root(tmp_path):
    """A fake / with one NVIDIA H200 as the driver lists it."""
    return h200_machine(tmp_path / "nvidia-root")


def test_no_gpu_skips_in_one_line_without_running(tmp_path, fake_python, records):
    outcome = run(tmp_path, tmp_path / "empty-root", fake_python, env=replay(records, r0=("ok", "exit 0")))
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == ("no usable GPU (rocm: /dev/kfd missing; cuda: /dev/nvidiactl missing)")
    assert outcome.cause == "machine"  # never cached: a later run on a machine with a GPU judges the commit
    assert Path(outcome.log_path).read_text() == outcome.reason + "\n"
    assert not list(records.iterdir())


def test_an_engine_killed_by_sigkill_is_a_skip_from_outside(tmp_path, gpu_root, fake_python, records):
    outcome = run(tmp_path, gpu_root, fake_python, env=replay(records, r0=("loading", "exit 137")))
    assert outcome.verdict is Verdict.SKIP and outcome.cause == "external-signal"
    assert outcome.reason.startswith("killed by SIGKILL from outside (OOM killer?) during engine start-up")


def test_the_gpus_a_step_sees_are_part_of_the_verdict_key(tmp_path, gpu_root, nvidia_root, monkeypatch):
    def gpus(root, options=None):
        scenario = create(NAME, options or {})
        scenario.system_root = root
        return scenario.identity(sys.executable)["environment"]["gpus"]

    for name in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    none, mi300x = gpus(tmp_path / "empty-root"), gpus(gpu_root)
    assert none["rocm"] == {"count": 0, "kinds": [], "none": "/dev/kfd missing"}
    assert mi300x["rocm"] == {"count": 2, "kinds": ["gfx942"]} and mi300x != none
    assert gpus(nvidia_root, {"platform": "cuda"}) == {"cuda": {"count": 1, "kinds": ["NVIDIA H200"]},
                                                      "visible_devices": {}}
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    assert gpus(gpu_root) == {**mi300x, "visible_devices": {"HIP_VISIBLE_DEVICES": "1"}}


def test_the_torch_in_the_key_is_asked_again_when_this_processs_environment_changes(tmp_path, monkeypatch):
    """The key names the torch the --python sees, asked once per environment: a process whose PYTHONPATH now
    brings another torch gets that torch's key (a cached answer from the earlier environment once made a run's
    keys differ from those of the same run started afresh: the verdicts stored by one were not served to the
    other)."""
    scenario = create(NAME, {})
    torches = (("rocm", ROCM_TORCH_FILES, "2.9.0+rocm7.0"), ("cuda", CUDA_TORCH_FILES, "2.11.0+cu130"))
    for name, files, version in torches:
        monkeypatch.setenv("PYTHONPATH", str(write_files(tmp_path / name, files)))
        assert scenario.identity(sys.executable)["environment"]["torch"] == version
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "rocm"))
    assert scenario.identity(sys.executable)["environment"]["torch"] == "2.9.0+rocm7.0"


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has /dev/kfd")
def test_this_machine_has_no_rocm_gpu(tmp_path, fake_python):
    scenario = create(NAME, {"platform": "rocm"})
    ctx = StepContext(checkout=tmp_path, log_path=tmp_path / "step.log", python=str(fake_python))
    outcome = scenario.run(ctx)
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == "no usable GPU (rocm: /dev/kfd missing)"


def test_auto_picks_cuda_with_a_cuda_torch_and_an_nvidia_gpu(tmp_path, nvidia_root, fake_python, records):
    env = {**replay(records, r0=("loading", "exit 1")), "FAKE_ENVIRONMENT": CUDA_TORCH,
           "VLLM_ROCM_USE_AITER": "1"}
    outcome = run(tmp_path, nvidia_root, fake_python, env=env)
    assert outcome.details["platform"] == "cuda" and outcome.details["attention_backend"] == "TRITON_MLA"
    assert outcome.details["gpu_targets"] == ["NVIDIA H200"]
    seen = json.loads((records / "rank0.json").read_text())
    assert not any(key.startswith(("VLLM_ROCM_USE_AITER", "HIP_")) for key in seen["env"])
    assert seen["argv"][seen["argv"].index("--attention-backend") + 1] == "TRITON_MLA"


def test_rocm_torch_on_an_nvidia_machine_is_no_usable_gpu(tmp_path, nvidia_root, fake_python):
    outcome = run(tmp_path, nvidia_root, fake_python, options={"platform": "cuda"})
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == "no usable GPU (cuda: torch 2.9.0+rocm7.0 here is no CUDA build)"


def test_checkout_pins_the_environment_violates_are_skip_with_both_versions(tmp_path, gpu_root, fake_python,
                                                                           records):
    requirements = tmp_path / "checkout/requirements"
    requirements.mkdir(parents=True)
    (requirements / "common.txt").write_text("transformers >= 5.5.3\n")
    outcome = run(tmp_path, gpu_root, fake_python, env=replay(records, r0=("ok", "exit 0")))
    assert (outcome.verdict, outcome.reason) == (
        Verdict.SKIP, "environment does not meet the checkout's pins: transformers >= 5.5.3 required by "
                      "requirements/common.txt, environment has 4.57.1")
    assert not list(records.iterdir())  # nothing was started


def test_too_few_gpus_for_dp_times_tp_skips(tmp_path, gpu_root, fake_python):
    outcome = run(tmp_path, gpu_root, fake_python, options={"dp": "2", "tp": "2"})
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == "needs 4 GPUs (dp=2 x tp=2), this step has 2"


def test_recorded_fault_then_abort_is_bad(tmp_path, gpu_root, fake_python, records):
    outcome = run(tmp_path, gpu_root, fake_python, env=replay(records, r0=("fault-in-capture", "abort")))
    assert outcome.verdict is Verdict.BAD
    assert outcome.reason == f"GPU memory fault during engine start-up/graph capture: {FAULT}"
    assert outcome.details["ranks"][0]["returncode"] == -6
    assert outcome.details["platform"] == "rocm"
    assert outcome.details["gpu_targets"] == ["gfx942", "gfx942"]
    log = Path(outcome.log_path).read_text()
    assert FAULT in log and "VLLM_ROCM_USE_AITER=1" in log


def test_the_child_gets_the_plan(tmp_path, gpu_root, fake_python, records):
    env = {**replay(records, r0=("ok", "exit 0")), "PYTHONPATH": "/elsewhere"}
    (tmp_path / "checkout/vllm").mkdir(parents=True)
    (tmp_path / "checkout/vllm/envs.py").write_text('"VLLM_ROCM_USE_AITER_MOE": lambda: True,\n')
    outcome = run(tmp_path, gpu_root, fake_python, env=env)
    assert outcome.verdict is Verdict.GOOD
    seen = json.loads((records / "rank0.json").read_text())
    checkout = str(tmp_path / "checkout")
    assert seen["cwd"] == checkout
    assert seen["env"]["PYTHONPATH"] == f"{checkout}{os.pathsep}/elsewhere"
    assert seen["env"]["HIP_VISIBLE_DEVICES"] == "0"
    assert seen["env"]["VLLM_ROCM_USE_AITER"] == "1"
    assert seen["env"]["VLLM_ROCM_USE_AITER_MOE"] == "0"  # the checkout's other AITER switches are off
    assert seen["argv"][1].endswith("/child.py") and not seen["argv"][1].startswith(checkout)
    assert seen["config"]["num_attention_heads"] == 128
    assert seen["config"]["kv_lora_rank"] == 512
    assert not Path(seen["argv"][1]).exists()  # the temporary work dir is gone after the step


@pytest.mark.parametrize("record, action, reason", [
    ("fault-then-engine-failed", "exit 1", "GPU memory fault during engine start-up/graph capture: "),
    ("core-abort", "exit 1", "SIGABRT during engine start-up/graph capture: Failed core proc(s): "),
    ("import-error", "exit 1", "import error: ModuleNotFoundError: No module named 'aiter'"),
    ("undefined-symbol", "exit 1", "build problem: ImportError: /src/vllm/vllm/_C.abi3.so: undefined"),
    ("oom", "exit 1", "out of GPU memory: torch.OutOfMemoryError: HIP out of memory."),
    ("no-gpu", "exit 1", "no GPU: RuntimeError: No HIP GPUs are available"),
])
def test_recorded_outputs_from_real_processes(tmp_path, gpu_root, fake_python, records, record, action,
                                              reason):
    outcome = run(tmp_path, gpu_root, fake_python, env=replay(records, r0=(record, action)))
    expected = Verdict.BAD if reason.startswith(("GPU", "SIGABRT")) else Verdict.SKIP
    assert outcome.verdict is expected
    assert outcome.reason.startswith(reason)


def test_hang_times_out_as_skip_and_leaves_no_process(tmp_path, gpu_root, fake_python, records):
    start = time.monotonic()  # 10 s: the rank starts and prints its phase well before, even under load
    outcome = run(tmp_path, gpu_root, fake_python, env=replay(records, r0=("loading", "hang")),
                  timeout=10)
    assert time.monotonic() - start < 300  # far less than the hang's 600 s
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == "timed out after 10s during engine start-up/graph capture"
    assert outcome.details["ranks"][0]["timed_out"] is True
    assert outcome.timed_out is True  # the engine caches it only for this timeout
    assert _gone_soon(int((records / "core0.pid").read_text()))


def _gone_soon(pid, seconds=120.0):
    """The process ends within seconds (a zombie awaiting its new parent's reaping counts as ended); the
    processes waited for sleep 600 s, so a generous deadline still tells killed from not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_lingering_after_the_marker_is_good(tmp_path, gpu_root, fake_python, records, monkeypatch):
    monkeypatch.setattr(launch, "GRACE", 0.5)
    start = time.monotonic()
    outcome = run(tmp_path, gpu_root, fake_python, env=replay(records, r0=("ok", "hang")))
    assert time.monotonic() - start < 300  # far less than the hang's 600 s
    assert outcome.verdict is Verdict.GOOD
    assert outcome.details["ranks"][0]["returncode"] is None


def test_dp2_runs_two_ranks_with_their_own_devices(tmp_path, gpu_root, fake_python, records):
    outcome = run(tmp_path, gpu_root, fake_python, options={"dp": "2"},
                  env=replay(records, r0=("ok", "exit 0"), r1=("ok", "exit 0")))
    assert outcome.verdict is Verdict.GOOD
    assert outcome.reason.startswith("all 2 DP ranks: ")
    envs = [json.loads((records / f"rank{rank}.json").read_text())["env"] for rank in (0, 1)]
    assert [env["HIP_VISIBLE_DEVICES"] for env in envs] == ["0", "1"]
    assert [env["VLLM_DP_RANK"] for env in envs] == ["0", "1"]
    assert {env["VLLM_DP_SIZE"] for env in envs} == {"2"}
    assert envs[0]["VLLM_DP_MASTER_PORT"] == envs[1]["VLLM_DP_MASTER_PORT"]
    log = Path(outcome.log_path).read_text()
    assert "===== rank 0: " in log and "===== rank 1: " in log


def test_dp2_fault_on_one_rank_stops_the_other(tmp_path, gpu_root, fake_python, records, monkeypatch):
    monkeypatch.setattr(launch, "GRACE", 0.5)
    start = time.monotonic()
    outcome = run(tmp_path, gpu_root, fake_python, options={"dp": "2"},
                  env=replay(records, r0=("loading", "hang"), r1=("fault-in-capture", "abort")))
    assert time.monotonic() - start < 300  # far less than the hang's 600 s
    assert outcome.verdict is Verdict.BAD
    assert outcome.reason == f"DP rank 1: GPU memory fault during engine start-up/graph capture: {FAULT}"
    assert [rank["returncode"] for rank in outcome.details["ranks"]] == [None, -6]


def test_cancel_stops_all_ranks_at_once(tmp_path, gpu_root, fake_python, records, wait_for):
    cancel = threading.Event()
    cores = [records / f"core{rank}.pid" for rank in (0, 1)]

    def cancel_once_both_engine_cores_run():
        wait_for(lambda: all(core.exists() and core.read_text() for core in cores))
        cancel.set()

    threading.Thread(target=cancel_once_both_engine_cores_run, daemon=True).start()
    scenario = create(NAME, {"dp": "2"})
    scenario.system_root = gpu_root
    ctx = StepContext(checkout=tmp_path, log_path=tmp_path / "step.log", timeout=60, python=str(fake_python),
                      env=replay(records, r0=("loading", "hang"), r1=("loading", "hang")), cancel=cancel)
    start = time.monotonic()
    with pytest.raises(Cancelled):
        scenario.run(ctx)
    assert time.monotonic() - start < 300  # far less than the ranks' 600 s
    for rank in (0, 1):
        assert _gone_soon(int((records / f"core{rank}.pid").read_text()))


def judged_step(tmp_path, root, python, env, runs=2, between=lambda: None):
    """The scenario's part of one step as the engine drives it (bisector/engine/judge.py): machine_check on the
    step's template before the build, `between` (the build), then runs with the build's PYTHONPATH added."""
    scenario = create(NAME, {})
    scenario.system_root = root
    checkout = tmp_path / "checkout"
    checkout.mkdir(exist_ok=True)
    template = StepContext(checkout=checkout, log_path=tmp_path / "logs", timeout=60, env=env, python=str(python))
    assert scenario.machine_check(template) is None
    between()
    built = {"PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    return [scenario.run(dataclasses.replace(template, log_path=tmp_path / f"logs/step-{n}.log",
                                             env={**built, **template.env}))
            for n in range(runs)]


def test_a_step_probes_its_environment_once(tmp_path, gpu_root, fake_python, records):
    probes, site = tmp_path / "probes.log", tmp_path / "site-packages"
    site.mkdir()
    env = {**replay(records, r0=("ok", "exit 0")), "FAKE_PROBE_LOG": str(probes), "FAKE_SITES": str(site)}
    outcomes = judged_step(tmp_path, gpu_root, fake_python, env)
    assert [outcome.verdict for outcome in outcomes] == [Verdict.GOOD, Verdict.GOOD]
    assert probes.read_text() == "probe\n"


def test_an_install_into_the_environment_during_the_step_is_probed_again(tmp_path, gpu_root, fake_python,
                                                                         records):
    probes, site = tmp_path / "probes.log", tmp_path / "site-packages"
    site.mkdir()
    env = {**replay(records, r0=("ok", "exit 0")), "FAKE_PROBE_LOG": str(probes), "FAKE_SITES": str(site),
           "FAKE_ENVIRONMENT_FILE": str(tmp_path / "environment.json")}

    def install_a_cpu_torch():  # what a build allowed to install into --python may do
        (site / "torch-2.9.0+cpu.dist-info").mkdir()
        Path(env["FAKE_ENVIRONMENT_FILE"]).write_text(json.dumps({**json.loads(ROCM_TORCH), "torch": "2.9.0+cpu",
                                                                  "torch_hip": None}))

    outcomes = judged_step(tmp_path, gpu_root, fake_python, env, runs=1, between=install_a_cpu_torch)
    assert probes.read_text() == "probe\nprobe\n"
    assert outcomes[0].verdict is Verdict.SKIP and "2.9.0+cpu" in outcomes[0].reason


def test_missing_python_is_skip(tmp_path, gpu_root):
    outcome = run(tmp_path, gpu_root, tmp_path / "no/such/python")
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason.startswith(f"cannot start {tmp_path / 'no/such/python'}: ")


def test_real_child_against_a_fake_vllm_in_the_checkout(tmp_path, gpu_root):
    write_files(tmp_path / "checkout", fake_vllm(selected="INFO Using AITER MLA backend."))
    site = write_files(tmp_path / "site", ROCM_TORCH_FILES)
    record = tmp_path / "vllm-record.jsonl"
    outcome = run(tmp_path, gpu_root, sys.executable,
                  options={"cudagraph_mode": "FULL_AND_PIECEWISE", "max_num_seqs": "4"},
                  env={"FAKE_VLLM_RECORD": str(record), "PYTHONPATH": str(site)})
    assert outcome.verdict is Verdict.GOOD, outcome.reason
    assert outcome.details["torch"] == "2.9.0+rocm7.0"
    assert outcome.reason.endswith("BISECTOR-SCENARIO-OK dp_rank=0 sequences=4 tokens=8")
    engine, generate = (json.loads(line) for line in record.read_text().splitlines())
    seen = {**engine, **generate}
    assert seen["kwargs"]["load_format"] == "dummy"
    assert seen["kwargs"]["kv_cache_dtype"] == "fp8"
    assert seen["kwargs"]["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert seen["kwargs"]["attention_backend"] == "ROCM_AITER_MLA"
    assert seen["kwargs"]["kv_cache_memory_bytes"] == 2 ** 30
    assert Path(seen["kwargs"]["model"]).parent == Path(os.environ["BISECTOR_CACHE_DIR"]) / "models"
    assert len(seen["prompts"]) == 4 and seen["params"]["max_tokens"] == 2
    assert "BISECTOR-ENGINE-READY dp_rank=0" in Path(outcome.log_path).read_text()
