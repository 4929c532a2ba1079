"""dpa-fp8-kv-graph-capture --option check=perf as a performance hunt (--metric decode_tok_s) in the other worlds
a step runs in: with --image, the real child.py in each commit's image through the fake container runtime
(tests/fakes/docker); with --aiter pinned, against each commit's pinned AITER built into a wheel and installed
for real. The fake vLLM (tests/fakes/vllm.py) has vLLM's step API (add_request/has_unfinished_requests/
step) and prints the recorded ROCm lines (dpa_fp8_kv_records); each engine step sleeps a planted time, half as
long again where the vLLM (in its image) or the AITER it imports is slow. Sleeps under load only lengthen, so the
planted 1.5x step stands out of a loaded machine's noise."""
from __future__ import annotations

import pytest
from dpa_fp8_kv_records import CAPTURE_47, PREFIX, ROCM_SELECTED
from fakes.containers import FakeDocker, vllm_site
from fakes.vllm import ROCM_TORCH_FILES, fake_vllm, write_files
from follow_pins_world import stand_in_aiter
from test_dpa_fp8_kv_scenario import gpu_root  # noqa: F401
from test_images_gpu import STACK, TEMPLATE

from bisector.engine.config import RunConfig
from bisector.engine.executor import LocalExecutor
from bisector.engine.run import run_bisection
from bisector.machine.gpus import gpu_env
from bisector.search.perf import Direction, PerfSettings
from bisector.world.images import ImageSettings, expand
from bisector.world.world import WorldSettings
from scenarios import create
from scenarios.dpa_fp8_kv.scenario import DpaFp8KvScenario

pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan, pytest.mark.slow]

NAME = "dpa-fp8-kv-graph-capture"
OPTIONS = {"max_num_seqs": "4", "check": "perf", "perf_repeats": "1", "perf_tokens": "8", "perf_batch": "4"}
STEP_SECONDS = 0.004
# The fake vLLM: its engine steps STEP_SECONDS, SLOWDOWN times that where its decode is slow.
SLOWDOWN = 1.5
ENGINE = {"selected": ROCM_SELECTED, "stderr": (PREFIX + CAPTURE_47,), "step_seconds": STEP_SECONDS}


def hunted(cfg: RunConfig):
    """The hunt's result and its perf record; every run measured by the child (engine steps, decode_tok_s)."""
    result = run_bisection(cfg)
    perf = result.to_json()["perf"]
    assert perf["metric"] == "decode_tok_s" and perf["direction"] == "higher-is-better"
    for step in result.steps:
        assert step.verdict == "good", step.reason  # every run measured
        measured = step.details["perf"]
        assert measured["method"] == "engine-steps" and measured["decode_tok_s"] > 0 and measured["ttft_ms"] > 0
    # each run is one sample: the scenario's decode_tok_s
    samples = sorted(round(value, 3) for entry in perf["commits"] for value in entry["samples"])
    assert samples == sorted(step.details["perf"]["decode_tok_s"] for step in result.steps)
    return result, perf


def slow_from(perf: dict, shas: list[str], culprit: int) -> None:
    """Every tested commit's median throughput: below the good end's by about a third from the culprit on."""
    by_sha = {entry["sha"]: entry for entry in perf["commits"]}
    fast = by_sha[shas[0]]["median"]
    for sha, entry in by_sha.items():
        assert (entry["median"] < 0.85 * fast) == (shas.index(sha) >= culprit), (shas.index(sha), entry["median"])
    # 4 sequences per step of at least 4 ms: at most 1,000 tokens/s, whatever the load
    assert fast <= 1000 * 1.02 and -0.45 < perf["change"]["relative"] < -0.2


CULPRIT = 5


def test_check_perf_in_each_commits_image_measures_decode_and_names_the_slow_commit(
        make_repo, tmp_path, gpu_root, monkeypatch):  # noqa: F811
    docker = FakeDocker(tmp_path / "fake")
    docker.activate(monkeypatch)
    repo = make_repo()
    shas = [repo.commit(f"change {i}", {"docker/Dockerfile.rocm_base": 'ARG AITER_BRANCH="v0.1.13"\n',
                                        "n": f"{i}\n"}) for i in range(8)]
    for index, sha in enumerate(shas):
        site = vllm_site(f"0.24.0.dev{index}+g{sha[:9]}.rocm700", index >= CULPRIT)
        fake = fake_vllm(**ENGINE, slowdown=SLOWDOWN if index >= CULPRIT else 1.0)
        docker.add_image(expand(TEMPLATE, sha), {**site, **fake, **STACK})
    scenario = create(NAME, OPTIONS)
    scenario.system_root = gpu_root
    result, perf = hunted(RunConfig(
        repo=repo.path, good=shas[0], bad=shas[-1], scenario=scenario, state_dir=tmp_path / "state",
        executor=LocalExecutor([gpu_env([1])]), world=WorldSettings(ImageSettings(TEMPLATE)), timeout=120,
        perf=PerfSettings("decode_tok_s", Direction.HIGHER)))
    assert result.culprit and result.culprit.sha == shas[CULPRIT]
    slow_from(perf, shas, CULPRIT)
    # each run was the real child in its commit's image, measured there
    children = [argv for argv in docker.runs() if any(arg.endswith("/child.py") for arg in argv)]
    assert len(children) == len(result.steps)
    for step in result.steps:
        assert step.details["image"]["torch"] == "2.9.0+rocm7.0"
        assert step.details["image"]["ref"] == expand(TEMPLATE, step.sha)


def test_check_perf_with_aiter_pinned_measures_each_commit_with_its_pinned_aiter(
        make_repo, tmp_path, monkeypatch, gpu_root, wheel_build):  # noqa: F811
    """AITER a1 (v0.1.12, fast) .. a3 (v0.1.13, its decode slow); vLLM v0..v5 moves the pin at v3: the slowdown
    is v3's, measured with the AITER each commit pins, built and installed for real."""
    aiter = make_repo("aiter")
    stand_in_aiter(aiter, 3, "SLOW_DECODE", flagged_from=3)
    monkeypatch.setenv("PYTHONPATH", str(write_files(tmp_path / "site", ROCM_TORCH_FILES)))
    monkeypatch.setattr(DpaFp8KvScenario, "system_root", gpu_root)
    vllm = make_repo("vllm")
    engine = fake_vllm(**ENGINE, slowdown=SLOWDOWN, slowdown_if_aiter="SLOW_DECODE")  # slow where its AITER is
    shas = [vllm.commit(f"vLLM change {i}", {
        "docker/Dockerfile.rocm_base": f'ARG AITER_BRANCH="{"v0.1.12" if i < 3 else "v0.1.13"}"\n'
                                       f'ARG AITER_REPO="{aiter.path}"\n',
        **engine, "n": f"{i}\n"}) for i in range(6)]
    result, perf = hunted(RunConfig(repo=vllm.path, good=shas[0], bad=shas[-1], scenario=create(NAME, OPTIONS),
                                    state_dir=tmp_path / "state", world=WorldSettings(aiter="pinned"), timeout=120,
                                    perf=PerfSettings("decode_tok_s", Direction.HIGHER)))
    assert result.culprit and result.culprit.sha == shas[3]
    change = result.to_json()["pin_change"]
    assert (change["from"], change["to"]) == ("v0.1.12", "v0.1.13")
    slow_from(perf, shas, 3)
    for step in result.steps:
        want = "0.1.12" if shas.index(step.sha) < 3 else "0.1.13"
        # the scenario saw the AITER the world installed: the pin's, in every run
        assert step.details["aiter"] == {"pinned": f"v{want}", "installed": want}
        assert f"AITER v{want} (" in step.build
