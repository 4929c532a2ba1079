"""Bisecting through a real local Ray cluster (CPU-only machine, two declared GPUs)."""
import json
import os
import shlex
import signal
import threading
import time
from pathlib import Path

import pytest
from test_held_continuation import NAME, pinned_vllm

from bisector.engine.config import RunConfig
from bisector.engine.executor import Placement, RayExecutor, node_cache_dir, ray_runtime_env
from bisector.engine.follow import pin_follow_up
from bisector.engine.run import run_bisection
from bisector.record.store import Store
from bisector.repo.refs import GitRepo
from bisector.repo.worktrees import NodeCheckout
from scenarios import create
from scenarios.command import CommandScenario

# One local Ray cluster per module run: under pytest-xdist (--dist loadgroup) all of it on one worker.
pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan, pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One small cluster for the module; workers keep their repo clones in a temp cache.

    Started with SIGINT ignored, as a cluster started by a background job or a CI runner is: its workers
    inherit that, and a step must be cancellable all the same.
    """
    ray = pytest.importorskip("ray")  # here, not at import: only the worker running these tests pays for it
    cache = tmp_path_factory.mktemp("node-cache")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env=ray_runtime_env())
    finally:
        signal.signal(signal.SIGINT, sigint)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    if saved is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = saved


def test_bisects_through_ray_with_a_gpu_per_step(cluster, make_repo, tmp_path, state_is_good):
    repo = make_repo()
    shas = repo.linear(30, bad_from=17)
    seen = tmp_path / "seen"
    scenario = CommandScenario(["sh", "-c", f'echo "$HIP_VISIBLE_DEVICES|$ROCR_VISIBLE_DEVICES|'
                                            f'$CUDA_VISIBLE_DEVICES" >> {seen}; echo checked $(cat counter.txt); '
                                + " ".join(state_is_good)])
    executor = RayExecutor(Placement(2, None, scenario.gpus_per_run, scenario.gpus_per_run, "file://" + str(repo.path)))
    result = run_bisection(RunConfig(repo=repo.path, good=shas[0], bad=shas[-1], jobs=2, scenario=scenario,
                                     state_dir=tmp_path / "state", executor=executor))
    assert result.culprit.sha == shas[17]
    assert set(seen.read_text().splitlines()) <= {"0|0|0", "0|1|0"}  # HIP|ROCR|CUDA
    for step in result.steps:
        log = (tmp_path / "state" / "logs" / "run-1" / os.path.basename(step.log))
        assert step.log == str(log)
        assert log.read_text() == f"checked {shas.index(step.sha)}\n"


def test_result_deciding_the_answer_cancels_the_ray_step(cluster, make_repo, tmp_path,
                                                         deciding_answer_kills_the_rest, pid_alive,
                                                         script_scenario, wait_for):
    repo = make_repo()
    shas = repo.linear(4, bad_from=1)
    start = time.monotonic()
    result = run_bisection(RunConfig(repo=repo.path, good=shas[0], bad=shas[3], jobs=2,
                                     scenario=script_scenario(deciding_answer_kills_the_rest),
                                     state_dir=tmp_path / "state",
                                     executor=RayExecutor(Placement(2, None, 0, 0, str(repo.path)))))
    assert time.monotonic() - start < 300  # well under the sleeper's 600 s: it did not wait for it
    assert result.culprit.sha == shas[1]
    sleeper = int((tmp_path / "sleeper").read_text())
    wait_for(lambda: not pid_alive(sleeper))  # ray.cancel reaches the worker after the run returns
    assert not pid_alive(sleeper)


# The first attempt on commit 3 records its Ray worker's pid and sleeps until the test kills the worker.
# The Ray worker is the parent of the step's leader (the script's parent).
FIRST_ATTEMPT_LOSES_ITS_WORKER = """
if [ "$n" = 3 ] && [ ! -f $PIDS/killed ]; then
  echo $$ > $PIDS/sleeper; cut -d' ' -f4 /proc/$PPID/stat > $PIDS/worker; exec sleep 60
fi
grep -q good state
"""


def test_killed_worker_is_retried_and_never_a_verdict(cluster, make_repo, tmp_path, script_scenario, wait_for):
    repo = make_repo()
    shas = repo.linear(10, bad_from=5)
    state = tmp_path / "state"
    outcome = {}

    def bisect():
        try:
            outcome["result"] = run_bisection(RunConfig(
                repo=repo.path, good=shas[0], bad=shas[9], jobs=2, state_dir=state,
                scenario=script_scenario(FIRST_ATTEMPT_LOSES_ITS_WORKER),
                executor=RayExecutor(Placement(2, None, 0, 0, str(repo.path)))))
        except BaseException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=bisect)
    runner.start()
    worker = tmp_path / "worker"
    assert wait_for(lambda: worker.exists() and worker.read_text().endswith("\n")), outcome  # written whole
    (tmp_path / "killed").touch()
    os.kill(int(worker.read_text()), signal.SIGKILL)
    os.kill(int((tmp_path / "sleeper").read_text()), signal.SIGKILL)
    runner.join(600)
    assert not runner.is_alive(), "the bisection did not end after its worker was killed"
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result.culprit.sha == shas[5]
    assert [(s.round, s.verdict) for s in result.steps if s.sha == shas[3]] == [(1, "good")]
    store = Store(state / "bisector.sqlite")
    assert [e.verdict for e in store.executions(shas[3], result.scenario)] == ["good"]
    store.close()


def test_cli_runs_on_an_existing_ray_cluster(cluster, make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(12, bad_from=8)
    before = repo.snapshot()
    out = tmp_path / "r.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--jobs", "3",
               "--executor", "ray", "--ray-address", cluster, "--json", str(out), "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["culprit"]["sha"] == shas[8]
    assert result["rounds"] <= 3
    assert repo.snapshot() == before


def test_unreachable_remote_stops_the_run_with_exit_4(cluster, make_repo, tmp_path, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--executor", "ray",
               "--ray-address", cluster, "--remote", str(tmp_path / "nowhere"), "--", *state_is_good)
    assert proc.returncode == 4, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bisector: error: aborted: on Ray node ") and "nowhere" in last
    assert "Traceback" not in proc.stderr



def test_a_level_inside_aiter_run_by_hand_builds_nothing_on_the_ray_nodes(cluster, make_repo, tmp_path, cli):
    """The GPU scenario's continuation inside AITER run by hand on Ray (--build auto, the default): its steps on the
    nodes open the run's own judge settings, which build none of the AITER checkouts (each step installs its AITER
    commit), as its local steps and the automatic level do; no node opens a build (the artifact cache and its
    record) for them. Here each step skips at that install (a stand-in AITER without requirements.txt)."""
    vllm, v = pinned_vllm(make_repo)
    asked = RunConfig(repo=vllm.path, good=v[0], bad=v[-1], state_dir=tmp_path / "state", scenario=create(NAME, {}))
    continuation = shlex.split(pin_follow_up(GitRepo(vllm.path), v[2], asked).continuation)
    source = continuation[continuation.index("--repo") + 1]
    proc = cli(*continuation[1:], "--executor", "ray", "--ray-address", cluster)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr  # the ends skip: no verdict
    steps = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("aiter-requirements failed" in line for line in steps), proc.stderr
    node_state = Path(f"{NodeCheckout(str(Path(source).resolve()), node_cache_dir(), v[0], tmp_path).clone_path}-state")
    assert (node_state / "aiter").is_dir()  # the steps ran there: the world installs each AITER commit
    assert not (node_state / "bisector.sqlite").exists()  # no build opened (an artifact cache keeps its record there)
