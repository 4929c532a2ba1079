"""Several slots on one GPU (--gpus 0:4), builds ahead of need (--build-ahead), the first engine start warming
the compile cache alone: on built histories, through the real CLI, with a GPU-shaped stand-in scenario (a
command, which wants one GPU per step) that records the environment each step saw."""
import dataclasses
import json
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
import test_dpa_fp8_kv_scenario as dpa
from fakes.executor import TableExecutor

from bisector.builds.builder import NoBuild
from bisector.engine.driver import RunContext
from bisector.engine.executor import local_slots
from bisector.engine.judge import Judge, JudgeSpec
from bisector.errors import UsageError
from bisector.machine.compile_cache import first_start
from bisector.machine.envs import EnvSettings
from bisector.machine.gpus import SHARE_ENV, parse_gpu_slots, refuse_shared_for_timing, shared_gpu_slots
from bisector.record.steps import Handler
from bisector.record.store import Execution, Store
from bisector.search.dag import Bisection
from bisector.search.policies import BisectPolicy, Endpoints
from bisector.signatures import SignatureRule
from bisector.world.world import WorldSettings
from scenarios.base import Verdict
from scenarios.command import CommandScenario

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]
gpu_root, fake_python, records = dpa.gpu_root, dpa.fake_python, dpa.records  # the GPU scenario's fixtures


# -- parsing and slot environments ------------------------------------------------------------------
@pytest.mark.unit
def test_gpu_shares_parse_into_gpus_and_their_slot_counts():
    assert parse_gpu_slots("0:4") == [(0, 4)]
    assert parse_gpu_slots("0:4,1:4") == [(0, 4), (1, 4)]
    assert parse_gpu_slots("0-2:2, 5") == [(0, 2), (1, 2), (2, 2), (5, 1)]
    assert parse_gpu_slots("0,1") == [(0, 1), (1, 1)]
    for bad, message in ((":4", "bad GPU list ':4'"), ("0:0", "bad GPU share '0:0'"),
                         ("0:x", "bad GPU share '0:x'"), ("3-1:2", "bad GPU range '3-1'")):
        with pytest.raises(UsageError, match=message):
            parse_gpu_slots(bad)


@pytest.mark.unit
def test_each_shared_slot_names_its_gpu_and_its_share():
    slots = shared_gpu_slots(parse_gpu_slots("0:4,1:2"), 1)
    assert [(s["ROCR_VISIBLE_DEVICES"], s["HIP_VISIBLE_DEVICES"], s["CUDA_VISIBLE_DEVICES"], s[SHARE_ENV])
            for s in slots] == [("0", "0", "0", "0.25")] * 4 + [("1", "0", "0", "0.5")] * 2
    # plain ids: the slots of before, no share
    assert shared_gpu_slots(parse_gpu_slots("0,1"), 1) == local_slots(2, [0, 1], 1)
    # two GPUs per step: each step sees both GPUs of its group, with the group's share
    pairs = shared_gpu_slots(parse_gpu_slots("0-3:2"), 2)
    assert [(s["ROCR_VISIBLE_DEVICES"], s[SHARE_ENV]) for s in pairs] == [("0,1", "0.5")] * 2 + [("2,3", "0.5")] * 2
    with pytest.raises(UsageError, match="the 2 GPUs of one step must hold the same number of slots"):
        shared_gpu_slots(parse_gpu_slots("0:2,1:4"), 2)


@pytest.mark.unit
def test_a_timing_hunt_refuses_shared_slots_in_one_line():
    refuse_shared_for_timing(local_slots(2, [0, 1], 1))  # a GPU per step: allowed
    refuse_shared_for_timing([{}])  # CPU slots: allowed
    with pytest.raises(UsageError) as refused:
        refuse_shared_for_timing(shared_gpu_slots(parse_gpu_slots("0:2"), 1))
    assert str(refused.value) == ("a performance hunt needs a GPU per step: shared slots (--gpus ID:N) would "
                                  "interfere with the timings; give --gpus without :N (the dpa-fp8-kv-graph-capture "
                                  "scenario's check=perf times alone on a shared GPU)")


# -- whole runs through the CLI ---------------------------------------------------------------------
SEEN = 'echo "$ROCR_VISIBLE_DEVICES|$HIP_VISIBLE_DEVICES|$CUDA_VISIBLE_DEVICES|$BISECTOR_GPU_SHARE" >> {seen}; '


@pytest.fixture(scope="module")
def history(tmp_path_factory, repo_builder):
    """20 commits, the fault from commit 11 on."""
    repo = repo_builder(tmp_path_factory.mktemp("history") / "repo")
    return repo, repo.linear(20, bad_from=11)


def bisect(cli, history, tmp_path, name, *options):
    """One run on history recording each step's GPU environment: (its JSON result, the environments seen,
    the commits handed to the slots in order, as progress says "testing SHA (NAME), ROLE …")."""
    repo, shas = history
    seen, result = tmp_path / f"{name}.seen", tmp_path / f"{name}.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / f"{name}-state"), *options, "--json", str(result), "--", "sh", "-c",
               SEEN.format(seen=seen) + "grep -q good state", env={"HIP_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    asked = [line.split()[1:] for line in proc.stderr.splitlines() if line.strip().startswith("testing ")]
    return json.loads(result.read_text()), set(seen.read_text().splitlines()), asked


def role_of(words: list[str]) -> str:
    """The step's role in a progress line's words after "testing": the sha, maybe its name, then the role."""
    return next(word for word in words[1:] if word in ("endpoint", "probe", "seed", "prefilter"))


def test_four_slots_on_one_gpu_test_four_commits_a_round(cli, history, tmp_path):
    repo, shas = history
    shared, seen, asked = bisect(cli, history, tmp_path, "shared", "--gpus", "0:4")
    assert seen == {"0|0|0|0.25"}  # ROCR|HIP|CUDA|share: GPU 0, a quarter of it, for every step
    separate, seen_separate, asked_separate = bisect(cli, history, tmp_path, "separate", "--gpus", "0-3", "--jobs", "4")
    assert seen_separate == {"0|0|0|", "1|0|0|", "2|0|0|", "3|0|0|"}
    one, _, asked_one = bisect(cli, history, tmp_path, "one", "--gpus", "0")
    assert shared["culprit"]["sha"] == separate["culprit"]["sha"] == one["culprit"]["sha"] == shas[11]
    # the search four GPUs get: the same rounds, the same commits handed out (4 probes a round)
    assert shared["rounds"] == separate["rounds"] < one["rounds"]
    assert asked == asked_separate
    roles = [role_of(words) for words in asked]
    assert roles[:6] == ["endpoint"] * 2 + ["probe"] * 4
    assert [role_of(words) for words in asked_one].count("probe") == one["rounds"]  # one a round


def test_the_run_record_says_the_slots_used_beside_the_jobs_asked(cli, history, tmp_path):
    """--gpus 0:4 without --jobs runs 4 steps at once: the stored run says slots 4 (jobs stays as given)."""
    bisect(cli, history, tmp_path, "recorded", "--gpus", "0:4")
    bisect(cli, history, tmp_path, "kept", "--gpus", "0:4", "--jobs", "2")
    for name, slots in (("recorded", 4), ("kept", 2)):
        with sqlite3.connect(tmp_path / f"{name}-state" / "bisector.sqlite") as db:
            (params,), = db.execute("SELECT params FROM runs").fetchall()
        assert {key: json.loads(params)[key] for key in ("jobs", "slots")} == \
            {"jobs": 1 if name == "recorded" else 2, "slots": slots}


def test_the_first_probe_round_runs_beside_the_endpoints(cli, history, tmp_path):
    """4 slots, 2 endpoints: the endpoint round tests the first round's 4 probes too, so one round fewer
    follows it; --no-verify-endpoints gives the slots to probes from the start, as before."""
    repo, shas = history
    result, _, asked = bisect(cli, history, tmp_path, "beside", "--gpus", "0:4")
    assert [role_of(words) for words in asked[:6]] == ["endpoint"] * 2 + ["probe"] * 4  # launched at once
    first = [step["role"] for step in result["steps"] if step["round"] == 0]  # landed (moot probes are cancelled)
    assert first.count("endpoint") == 2 and first.count("probe") >= 1
    assert result["culprit"]["sha"] == shas[11] and result["rounds"] == 1
    unverified, _, asked = bisect(cli, history, tmp_path, "unverified", "--gpus", "0:4", "--no-verify-endpoints")
    assert unverified["culprit"]["sha"] == shas[11]
    assert "endpoint" not in {role_of(words) for words in asked}
    assert {step["round"] for step in unverified["steps"]} == set(range(1, unverified["rounds"] + 1))


def test_an_end_that_tests_otherwise_stops_the_run_though_probes_ran_beside_it(cli, repo_builder, tmp_path):
    """The bad end tests good: exit 3 as before; the probes of its round are stored, verdicts of their commits."""
    repo = repo_builder(tmp_path / "repo")
    shas = repo.linear(9, bad_from=None)
    before = repo.snapshot()
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--gpus", "0:4", "--", "sh", "-c", "grep -q good state", env={"HIP_VISIBLE_DEVICES": ""})
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"bisector: error: endpoint check failed: bad {shas[-1]} ({shas[-1][:12]}) tested good, not bad")
    with sqlite3.connect(state / "bisector.sqlite") as db:
        steps = db.execute("SELECT sha, role, round, verdict FROM steps").fetchall()
        stored = {sha for (sha,) in db.execute("SELECT sha FROM executions WHERE verdict = 'good'")}
    probes = {sha for sha, role, round_no, verdict in steps if role == "probe" and round_no == 0 and verdict == "good"}
    assert probes and probes <= set(shas[1:-1]) and probes <= stored  # moot ones were cancelled
    assert {role for _, role, _, _ in steps} == {"endpoint", "probe"}
    assert repo.snapshot() == before


class BadEndLandsLast(TableExecutor):
    """A table whose new end's step finishes only once another step has landed (`landed` is set), and whose bad
    runs give signatures: the new end's `the fault`, any other commit's `crash in SHA`."""

    def __init__(self, verdicts: dict[str, tuple[str, ...]], new_end: str):
        super().__init__(verdicts, "skip", size=4)
        self.new_end, self.landed = new_end, threading.Event()

    def run_step(self, judge, sha: str, done: list) -> Future:
        step = super().run_step(judge, sha, done)
        if sha != self.new_end:
            return step
        later: Future = Future()
        threading.Thread(target=lambda: (self.landed.wait(), later.set_result(step.result())), daemon=True).start()
        return later

    def _execute(self, sha: str) -> Execution:
        signature = "the fault" if sha == self.new_end else f"crash in {sha}"
        return dataclasses.replace(super()._execute(sha), signature=signature)


@pytest.mark.unit
def test_probes_beside_the_endpoints_wait_for_the_bad_ends_signature(tmp_path):
    """--signature auto: the bad end's signature is the fault hunted. The probes beside the endpoints finish
    first, each failing otherwise; they are judged once the bad end has landed: skips (a different failure),
    not bad."""
    shas = [f"c{i}" for i in range(9)]
    executor = BadEndLandsLast({"c0": ("good",)}, "c8")
    executor.default = "bad"
    store = Store(tmp_path / "bisector.sqlite")
    spec = JudgeSpec(CommandScenario(["true"]), NoBuild(), None, "python3", 1, SignatureRule.parse("auto"))
    judge = Judge(spec, NoBuild().open(None, None), EnvSettings().open(tmp_path), WorldSettings().open(None, tmp_path))
    ends = Endpoints("c0", "c8", "good", "bad", "c0", "c8")
    commits = [(sha, (shas[i - 1],)) for i, sha in enumerate(shas) if i]

    class Landed(Handler):
        def tested(self, step, left, steps_left):
            executor.landed.set()

    with store.recording("bisect", "signature auto", {}) as record:
        ctx = RunContext(store, judge, executor, record.id, Landed())
        ctx.drive(BisectPolicy(Bisection(commits, "c8"), ends, executor.size, lambda sha: 1.0))
        record.result = {}
    probes = [step for step in ctx.steps if step.round == 0 and step.role == "probe"]
    assert len(probes) == 4 and executor.asked[:2] == ["c0", "c8"]
    assert judge.signature.learned == "the fault"
    assert {(step.verdict, step.reason.split(":")[0]) for step in probes} == {("skip", "different failure")}


def test_slots_across_gpus_each_name_their_gpu(cli, history, tmp_path):
    result, seen, _ = bisect(cli, history, tmp_path, "across", "--gpus", "0:2,1:2")
    assert seen == {"0|0|0|0.5", "1|0|0|0.5"}
    assert result["culprit"]["sha"] == history[1][11]


@pytest.mark.parametrize("options, message", [
    (["--gpus", "0:0"], "bad GPU share '0:0' in '0:0'"),
    (["--jobs", "5", "--gpus", "0:4"], "--jobs 5 needs 5 slots; --gpus 0:4 gives 4"),
    (["--gpus-per-run", "2", "--gpus", "0:2,1:4"], "the 2 GPUs of one step must hold the same number of slots"),
    (["--gpus-per-run", "0", "--gpus", "0:2"], "shares GPUs between steps, but this run's steps use no GPU"),
    (["--build-ahead", "-1"], "Invalid value for '--build-ahead': -1 is not in the range 0<=x<=64."),
])
def test_bad_slot_options_are_usage_errors(cli, history, options, message, state_is_good):
    repo, shas = history
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], *options,
               "--", *state_is_good, env={"HIP_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"bisector: error: {message}" or \
        (proc.stderr.startswith("bisector: error: ") and message in proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert repo.snapshot() == before


# -- builds ahead ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def native_history(tmp_path_factory, repo_builder):
    """16 vLLM-shaped commits whose native sources all differ (each compiles), the fault from commit 11 on."""
    repo = repo_builder(tmp_path_factory.mktemp("native") / "repo")
    repo.commit("build files", {"setup.py": "", "vllm/__init__.py": "", "csrc/x.c": "int x;\n"})
    shas = [repo.commit(f"change {i}", {"counter.txt": f"{i}\n", "state": "bad\n" if i >= 11 else "good\n",
                                        "csrc/x.c": f"int x = {i};\n"}) for i in range(16)]
    return repo, shas


def build_ahead_run(cli, native_history, tmp_path, budget: int):
    """A --build auto run whose compiles a fake python records. With a budget, each step waits (at most
    30 s) for a first build ahead to land, so that one has. (result, commits compiled, build records' logs)."""
    repo, shas = native_history
    name = f"ahead-{budget}"
    state, built = tmp_path / f"{name}-state", tmp_path / f"{name}.built"
    python = tmp_path / f"{name}-python"
    python.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *setup.py*) cat counter.txt >> {built}; exit 0;; esac
        exec {sys.executable} "$@"
        """))
    python.chmod(0o755)
    wait_ahead = f"for i in $(seq 600); do ls {state}/logs/*/ahead/*.log >/dev/null 2>&1 && break; sleep 0.05; done; "
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--build", "auto", "--python", str(python), "--build-ahead", str(budget),
               "--json", str(tmp_path / f"{name}.json"),
               "--", "sh", "-c", (wait_ahead if budget else "") + "grep -q good state", env={"HIP_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(state / "bisector.sqlite") as db:
        logs = [row[0] for row in db.execute("SELECT log_path FROM builds WHERE status = 'ok'")]
    compiled = [int(line) for line in built.read_text().split()]
    return json.loads((tmp_path / f"{name}.json").read_text()), compiled, logs


def test_builds_ahead_prepare_the_next_round_within_the_budget(cli, native_history, tmp_path):
    repo, shas = native_history
    plain, plain_compiled, plain_logs = build_ahead_run(cli, native_history, tmp_path, 0)
    ahead, compiled, logs = build_ahead_run(cli, native_history, tmp_path, 2)
    # the same search and answer
    assert ahead["culprit"]["sha"] == plain["culprit"]["sha"] == shas[11]
    assert [(s["sha"], s["round"]) for s in ahead["steps"]] == [(s["sha"], s["round"]) for s in plain["steps"]]
    tested = {shas.index(s["sha"]) for s in plain["steps"]}
    assert sorted(plain_compiled) == sorted(tested) and not any("/ahead/" in log for log in plain_logs)
    # each commit compiled once, by its step or ahead of it; every build ahead is kept in the artifact cache
    assert len(compiled) == len(set(compiled)) == len(logs) and set(compiled) >= tested
    made_ahead = [log for log in logs if "/ahead/" in log]
    assert made_ahead
    assert len(made_ahead) <= 2 * (ahead["rounds"] + 1)  # the budget: 2 a round, the endpoints' round included
    first_probe = next(s for s in ahead["steps"] if s["round"] == 1)
    assert any(f"build-{first_probe['sha'][:12]}" in log for log in made_ahead)  # built during the endpoints
    assert "built before" in first_probe["build"], first_probe["build"]


# -- the GPU scenario on a shared slot ----------------------------------------------------------------
def test_the_gpu_scenario_bounds_its_engine_by_the_slots_share(tmp_path, gpu_root, fake_python, records):
    slot = shared_gpu_slots(parse_gpu_slots("1:4"), 1)[0]
    outcome = dpa.run(tmp_path, gpu_root, fake_python, env={**dpa.replay(records, r0=("ok", "exit 0")), **slot})
    assert outcome.verdict is Verdict.GOOD, outcome.reason
    seen = json.loads((records / "rank0.json").read_text())
    argv = seen["argv"]
    # the defaults (0.5 of the GPU, a 1 GiB KV cache) scaled by the slot's quarter
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.125"
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(1024 ** 3 // 4)
    assert seen["env"]["HIP_VISIBLE_DEVICES"] == seen["env"]["CUDA_VISIBLE_DEVICES"] == "1"  # physical GPU 1
    assert outcome.details["gpu_share"] == 0.25


def test_a_whole_gpu_keeps_the_options_and_a_bad_share_is_a_machine_skip(tmp_path, gpu_root, fake_python,
                                                                          records):
    outcome = dpa.run(tmp_path, gpu_root, fake_python, env=dpa.replay(records, r0=("ok", "exit 0")))
    argv = json.loads((records / "rank0.json").read_text())["argv"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5" and "gpu_share" not in outcome.details
    skipped = dpa.run(tmp_path, gpu_root, fake_python, env={**dpa.replay(records, r0=("ok", "exit 0")), SHARE_ENV: "2"})
    assert skipped.verdict is Verdict.SKIP and skipped.cause == "machine"
    assert skipped.reason == f"{SHARE_ENV}='2': must be in (0, 1]"


# -- the compile cache's first start ------------------------------------------------------------------
CHILD_DIR = Path(__file__).resolve().parents[1] / "scenarios/dpa_fp8_kv"


def gated_engine(gate: Path) -> subprocess.Popen:
    """A process that waits at the real child's start gate, as an engine of a waiting slot does, then exits."""
    code = f"import sys; sys.path.insert(0, {str(CHILD_DIR)!r}); import child; child.pass_start_gate(sys.argv[1])"
    return subprocess.Popen([sys.executable, "-c", code, str(gate)])


@pytest.mark.unit
def test_the_first_engine_start_compiles_alone_and_the_engines_beside_it_wait_at_its_gate(tmp_path):
    with first_start(tmp_path, "key") as first:
        assert first.gate is None  # the first start goes straight on
        with first_start(tmp_path, "key") as second:  # another slot enters at once: its engines wait instead
            assert second.gate == tmp_path / "compile/warm/key.lock"
            engine = gated_engine(second.gate)
            with pytest.raises(subprocess.TimeoutExpired):
                engine.wait(0.5)  # held while the first engine starts
            first.up()  # the engine is up (or its compile saved): the waiting engine goes on
            assert engine.wait(60) == 0
    assert (tmp_path / "compile/warm/key").is_file()
    # warm: nobody waits, even beside a start of another configuration holding its own lock
    with first_start(tmp_path, "other") as other, first_start(tmp_path, "key") as warm:
        assert other.gate is None and warm.gate is None


@pytest.mark.unit
def test_a_first_start_that_dies_opens_its_gate(tmp_path):
    """A driver killed while its engine compiles leaves no warm mark, but its lock dies with it: the engines
    waiting at its gate go on (and compile themselves) instead of waiting out their timeout."""
    ready = tmp_path / "holding"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import pathlib, time
        from bisector.machine.compile_cache import first_start
        with first_start(pathlib.Path({str(tmp_path)!r}), "key"):
            pathlib.Path({str(ready)!r}).touch()
            time.sleep(600)
        """)], cwd=Path(__file__).resolve().parents[1])
    try:
        while not ready.exists():
            assert holder.poll() is None, "the holder ended before it held the first start"
            threading.Event().wait(0.05)
        with first_start(tmp_path, "key") as waiting:
            assert waiting.gate is not None
            engine = gated_engine(waiting.gate)
            with pytest.raises(subprocess.TimeoutExpired):
                engine.wait(0.5)
            holder.kill()
            assert engine.wait(60) == 0
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "compile/warm/key").exists()


# -- --plan -------------------------------------------------------------------------------------------
def test_plan_shows_the_rounds_the_slots_give(cli, history, tmp_path):
    repo, shas = history
    rounds, texts = {}, {}
    for gpus, *verify in (("0",), ("0:4",), ("0:4", "--no-verify-endpoints")):
        plan = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--gpus", gpus, "--plan",
                   *verify, "--state-dir", str(tmp_path / "plan-state"), "--json", str(tmp_path / "plan.json"),
                   "--", "sh", "-c", "grep -q good state", env={"HIP_VISIBLE_DEVICES": ""})
        assert plan.returncode == 0, plan.stderr
        planned = json.loads((tmp_path / "plan.json").read_text())
        asked = " ".join((gpus, *verify))
        rounds[asked], texts[asked] = planned["rounds"], plan.stdout
        assert planned["slots"] == (4 if gpus == "0:4" else 1) and planned["rounds_one_slot"] == 5
        assert sum(probe["role"] == "probe 1" for probe in planned["probes"]) == planned["slots"]
    # 18 commits to split: 5 halvings, or 2 rounds of fifths, the first of them beside the endpoints (without
    # endpoints to verify, both after them)
    assert rounds == {"0:4": 1, "0": 5, "0:4 --no-verify-endpoints": 2}
    assert "rounds: about 1 after the endpoints with 4 slots (one slot: about 5); a round takes about one " \
           "step's time" in " ".join(texts["0:4"].split())
    assert "rounds: about 5 after the endpoints with 1 slot; a round" in " ".join(texts["0"].split())
    for gpus in ("0:4", "0"):  # the estimate is what the search needs at most
        result, _, _ = bisect(cli, history, tmp_path, f"plan-{gpus}", "--gpus", gpus)
        assert result["rounds"] <= rounds[gpus]
    assert result["rounds"] > rounds["0:4"]


def test_plan_times_the_rounds_by_the_scenarios_earlier_steps_here(cli, history, tmp_path):
    """--plan turns its rounds into a time once this state dir has timed steps of the scenario: the rounds
    (the endpoints' and the probes') times the median of the latest steps; before any, it says it cannot."""
    repo, shas = history
    state = tmp_path / "timed-state"

    def plan(gpus: str) -> tuple[dict, str]:
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--gpus", gpus, "--plan",
                   "--state-dir", str(state), "--json", str(tmp_path / "plan.json"), "--", "sh", "-c",
                   "sleep 0.2; grep -q good state", env={"HIP_VISIBLE_DEVICES": ""})
        assert proc.returncode == 0, proc.stderr
        return json.loads((tmp_path / "plan.json").read_text()), " ".join(proc.stdout.split())

    untimed, text = plan("0:4")
    assert "step_seconds" not in untimed
    assert "time: no earlier step of this scenario in this state dir to time a round by" in text
    ran = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
              "--", "sh", "-c", "sleep 0.2; grep -q good state", env={"HIP_VISIBLE_DEVICES": ""})
    assert ran.returncode == 0, ran.stderr
    with sqlite3.connect(state / "bisector.sqlite") as db:
        seconds = sorted(row[0] for row in db.execute("SELECT seconds FROM executions"))
    median = statistics.median(seconds)
    assert median >= 0.2  # each step slept
    for gpus, endpoint_rounds in (("0:4", 1), ("0", 2)):
        timed, text = plan(gpus)
        assert (timed["step_seconds"], timed["timed_steps"], timed["endpoint_rounds"]) == \
            (pytest.approx(median), len(seconds), endpoint_rounds)
        assert timed["seconds_to_answer"] == pytest.approx((endpoint_rounds + timed["rounds"]) * median)
        assert (f"time: about {timed['seconds_to_answer']:.0f} s of steps to the answer ({endpoint_rounds} "
                f"endpoint round{'' if endpoint_rounds == 1 else 's'} and {timed['rounds']} more, ~{median:.0f} s a "
                f"step: the median of the last {len(seconds)} steps") in text


def test_a_gpu_step_waits_for_the_first_engine_start_of_its_settings(tmp_path, gpu_root, fake_python, records,
                                                                     wait_for):
    import os

    from scenarios import create
    from scenarios.dpa_fp8_kv.options import warm_key

    root = Path(os.environ["BISECTOR_CACHE_DIR"])
    key = warm_key(create(dpa.NAME, {}).settings, "rocm", str(fake_python))
    outcomes = []
    with first_start(root, key) as first:  # another slot's engine of the same settings is starting
        step = threading.Thread(target=lambda: outcomes.append(dpa.run(tmp_path, gpu_root, fake_python,
                                                                       env=dpa.replay(records, r0=("ok", "exit 0")))))
        step.start()
        assert wait_for((records / "launched0").exists)  # its engine's Python starts at once ...
        assert not wait_for((records / "rank0.json").exists, 1.0)  # ... and waits at the gate
        first.up()  # that engine is up: its compiles are in the cache
        assert wait_for((records / "rank0.json").exists)
    step.join()
    assert outcomes[0].verdict is Verdict.GOOD
    assert (root / "compile/warm" / key).is_file()


ENGINE_WITH_GATES = f"""#!{sys.executable}
# An engine start the test holds at two points: with FAKE_GATES it says it started, waits for the file
# "publish" there, saves a compiled model where vLLM does, waits for the file "up", then runs as the GPU
# scenario's fake python (which prints the ready marker). The environment probe goes straight through.
import os, sys, time
gates = os.environ.get("FAKE_GATES")
if gates and not sys.argv[1].endswith("probe_env.py"):
    def wait(name):
        while not os.path.exists(os.path.join(gates, name)):
            time.sleep(0.05)
    open(os.path.join(gates, "started"), "w").close()
    wait("publish")
    saved = os.path.join(os.environ["VLLM_CACHE_ROOT"], "torch_compile_cache", "torch_aot_compile", "h", "rank_0_0")
    os.makedirs(saved)
    open(os.path.join(saved, "model"), "w").close()
    wait("up")
os.execv(os.environ["FAKE_ENGINE"], [os.environ["FAKE_ENGINE"], *sys.argv[1:]])
"""


def test_the_slots_waiting_for_the_first_start_go_once_its_compile_is_saved(tmp_path, gpu_root, fake_python,
                                                                            wait_for):
    """The first engine start of a run lets the steps waiting for it go when vLLM has saved its compiled
    model, not when the engine is up (graph capture and the rest of its start no longer hold them)."""
    engine = tmp_path / "bin/engine-with-gates"
    engine.write_text(ENGINE_WITH_GATES)
    engine.chmod(0o755)
    gates, outcomes = tmp_path / "gates", {}
    gates.mkdir()

    def step(name: str, **env: str) -> threading.Thread:
        (tmp_path / name / "records").mkdir(parents=True)
        given = {**dpa.replay(tmp_path / name / "records", r0=("ok", "exit 0")), "FAKE_ENGINE": str(fake_python),
                 **env}
        thread = threading.Thread(target=lambda: outcomes.update(
            {name: dpa.run(tmp_path / name, gpu_root, engine, env=given)}))
        thread.start()
        return thread

    first = step("first", FAKE_GATES=str(gates))
    assert wait_for((gates / "started").exists)  # the first engine starts, compiling
    second = step("second")
    assert not wait_for((tmp_path / "second/records/rank0.json").exists, 1.0)  # the other slot waits
    (gates / "publish").touch()
    assert wait_for((tmp_path / "second/records/rank0.json").exists)  # it goes while the first is not up
    assert "first" not in outcomes
    (gates / "up").touch()
    first.join()
    second.join()
    assert outcomes["first"].verdict is outcomes["second"].verdict is Verdict.GOOD


def test_a_performance_hunt_on_shared_slots_is_refused_before_anything_runs(cli, history, tmp_path):
    repo, shas = history
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(tmp_path / "state"), "--gpus", "0:2", "--metric", "tok_s", "--", "sh", "-c", "touch ran")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bisector: error: a performance hunt needs a GPU per step: shared slots (--gpus ID:N) would interfere "
        "with the timings; give --gpus without :N (the dpa-fp8-kv-graph-capture scenario's check=perf times alone "
        "on a shared GPU)"]
    assert not (repo.path / "ran").exists() and not (tmp_path / "state").exists()
    assert repo.snapshot() == before


# -- --plan's AITER line ------------------------------------------------------------------------------
def python_with_torch(tmp_path: Path, name: str, hip: str | None) -> Path:
    """An interpreter whose environment holds a torch (ROCm when hip is given, else CUDA) and no AITER."""
    site = tmp_path / f"{name}-site"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text("")
    (site / "torch/version.py").write_text(f"hip = {hip!r}\ncuda = {None if hip else '12.8'!r}\n")
    python = tmp_path / f"{name}-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_the_plan_says_aiter_is_unused_without_a_rocm_torch_as_the_run_finds(cli, repo_builder, tmp_path):
    """--aiter installed (dpa-fp8-kv-graph-capture's default) on a CUDA torch: the run does not look at AITER,
    and the plan says so, not that every step would skip; on a ROCm torch without the pin, a skip, as before."""
    repo = repo_builder(tmp_path / "repo")
    shas = [repo.commit(f"change {i}", {"docker/Dockerfile.rocm_base": 'ARG AITER_BRANCH="v0.1.13.post1"\n',
                                        "state": "bad\n" if i >= 2 else "good\n"}) for i in range(4)]
    cuda, rocm = python_with_torch(tmp_path, "cuda", None), python_with_torch(tmp_path, "rocm", "7.0.51831")

    def run(python: Path, *options: str) -> dict:
        out = tmp_path / f"{python.name}{'-plan' if options else ''}.json"
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--aiter", "installed",
                   "--python", str(python), "--state-dir", str(tmp_path / f"{python.name}-state"), *options,
                   "--json", str(out), "--", "sh", "-c", "grep -q good state")
        assert proc.returncode == 0, proc.stderr
        return json.loads(out.read_text())

    assert {probe["world"] for probe in run(cuda, "--plan")["probes"]} == {
        "no ROCm torch: AITER unused (the commit pins v0.1.13.post1)"}
    assert {probe["world"] for probe in run(rocm, "--plan")["probes"]} == {
        "AITER must be the pin v0.1.13.post1: AITER not installed, commit pins v0.1.13.post1: skip"}
    result = run(cuda)
    assert result["culprit"]["sha"] == shas[2] and {step["verdict"] for step in result["steps"]} == {"good", "bad"}
