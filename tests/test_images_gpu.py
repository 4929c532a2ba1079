"""The GPU scenario in per-commit images: the real scenario and its real child.py, launched through a fake
`docker` (tests/fakes/docker) into fake images whose vLLM (tests/fakes/vllm.py) stands in for the engine
(a GPU memory fault from the culprit on), with a fake /dev/kfd and KFD topology. And a real-runtime test, run only
where docker and an AMD GPU exist."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.containers import RENDER_GID, FakeDocker, vllm_site
from fakes.vllm import ROCM_TORCH_FILES, fake_vllm
from test_dpa_fp8_kv_scenario import gpu_root  # noqa: F401 - the fixture

from bisector.engine.config import RunConfig
from bisector.engine.executor import LocalExecutor
from bisector.engine.run import run_bisection
from bisector.machine.gpus import gpu_env
from bisector.machine.probe_env import SCRIPT as PROBE_SCRIPT
from bisector.world.images import ImageSettings, expand
from bisector.world.world import WorldSettings
from scenarios import create

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]

TEMPLATE = "rocm/vllm-ci:{commit}"
NAME = "dpa-fp8-kv-graph-capture"
FAULT = ("Memory access fault by GPU node-2 (Agent handle: 0x5581) on address 0x7f3a00000000. "
         "Reason: Page not present or supervisor privilege.")
# The image's ROCm torch and AITER, as their metadata and torch/version.py show them.
STACK = {**ROCM_TORCH_FILES,
         "amd_aiter-0.1.13.dist-info/METADATA": "Metadata-Version: 2.1\nName: amd-aiter\nVersion: 0.1.13\n"}
CULPRIT = 5


def image_site(sha: str, index: int) -> dict[str, str]:
    broken = index >= CULPRIT  # the metadata sized for the wrong query dtype: the decode graph faults
    site = vllm_site(f"0.24.0.dev{index}+g{sha[:9]}.rocm700", broken)
    return {**site, **fake_vllm(selected="INFO Using ROCM_AITER_MLA backend.", fault=FAULT if broken else None),
            **STACK}


def test_a_gpu_bisection_in_images_launches_each_rank_in_its_commits_image(make_repo, tmp_path, gpu_root,  # noqa: F811
                                                                           monkeypatch):
    docker = FakeDocker(tmp_path / "fake")
    docker.activate(monkeypatch)
    repo = make_repo()
    shas = [repo.commit(f"change {i}", {"docker/Dockerfile.rocm_base": 'ARG AITER_BRANCH="v0.1.13"\n',
                                        "vllm/envs.py": '"VLLM_ROCM_USE_AITER_MOE"\n', "n": f"{i}\n"})
            for i in range(8)]
    for index, sha in enumerate(shas):
        docker.add_image(expand(TEMPLATE, sha), image_site(sha, index))
    scenario = create(NAME, {"max_num_seqs": "4"})
    scenario.system_root = gpu_root
    slot = gpu_env([1])  # this step's GPU: the machine's second
    cfg = RunConfig(repo=repo.path, good=shas[0], bad=shas[-1], scenario=scenario, state_dir=tmp_path / "state",
                    executor=LocalExecutor([slot]), world=WorldSettings(ImageSettings(TEMPLATE)), timeout=120)
    result = run_bisection(cfg)
    assert result.culprit and result.culprit.sha == shas[CULPRIT]
    bad = next(step for step in result.steps if step.sha == shas[CULPRIT])
    assert bad.verdict == "bad" and FAULT[:40] in bad.reason
    assert bad.details["image"]["torch"] == "2.9.0+rocm7.0" and bad.details["image"]["aiter"] == "0.1.13"
    assert bad.details["image"]["hip"] == "7.0.51831"
    assert bad.details["platform"] == "rocm" and bad.details["torch"] == "2.9.0+rocm7.0"
    ranks = [argv for argv in docker.runs() if any(a.endswith("/child.py") for a in argv)]
    probes = [argv for argv in docker.runs() if str(PROBE_SCRIPT) in argv]
    assert len(ranks) == len(probes) == len(result.steps)
    for argv in ranks:
        flags = argv[argv.index("--name") + 2:]
        assert flags[:12] == ["--device", "/dev/kfd", "--device", "/dev/dri/renderD136", "--group-add", RENDER_GID,
                              "--group-add", "video", "--ulimit", "core=0", "--ipc=host", "--shm-size=16g"]
        variables = dict(a.split("=", 1) for a, flag in zip(argv[1:], argv) if flag == "-e")
        assert variables["HIP_VISIBLE_DEVICES"] == variables["CUDA_VISIBLE_DEVICES"] == "0"  # its one GPU
        assert "ROCR_VISIBLE_DEVICES" not in variables
        assert variables["VLLM_ROCM_USE_AITER"] == "1" and variables["VLLM_ROCM_USE_AITER_MOE"] == "0"
        assert "PYTHONPATH" not in variables  # the image's vLLM, not the checkout's source
        assert argv[argv.index("--entrypoint") + 1] == "python3"
        volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
        work = Path(argv[argv.index("--entrypoint") + 3]).parent
        assert f"{work}:{work}" in volumes and f"{PROBE_SCRIPT.parent}:{PROBE_SCRIPT.parent}:ro" in volumes
    assert not any((docker.home / "containers").iterdir())


def test_data_parallel_ranks_cannot_talk_without_a_network(make_repo, tmp_path, gpu_root,  # noqa: F811
                                                          monkeypatch):
    docker = FakeDocker(tmp_path / "fake")
    docker.activate(monkeypatch)
    repo = make_repo()
    sha = repo.commit("one", {"n": "1\n"})
    docker.add_image(expand(TEMPLATE, sha), image_site(sha, 0))
    scenario = create(NAME, {"dp": "2"})
    scenario.system_root = gpu_root
    from bisector.engine.judge import JudgeSpec
    from bisector.engine.run import judge_one
    judge = JudgeSpec(scenario, scenario_build(), 120, sys.executable, world=WorldSettings(ImageSettings(TEMPLATE)))
    outcome = judge_one(repo.path, sha, judge, tmp_path / "state")
    assert outcome.verdict == "skip"
    assert outcome.reason == ("dp=2 runs one container per rank and the ranks talk over TCP: give "
                              "--container-network host (not cached: the machine, not the commit)")


def scenario_build():
    from bisector.builds import BuildSettings
    return BuildSettings("none", sys.executable)


def docker_with_amd_gpu() -> bool:
    """A working docker daemon and an AMD GPU on this machine."""
    if shutil.which("docker") is None or not os.path.exists("/dev/kfd"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not docker_with_amd_gpu(), reason="needs a docker daemon and an AMD GPU (/dev/kfd)")
def test_real_runtime_judges_a_commit_in_its_rocm_vllm_ci_image(tmp_path, cli):
    """On a ROCm machine with docker: vLLM's own CI image of a known commit, judged by a command that imports
    its vLLM and asks torch for the GPU. BISECTOR_REAL_IMAGE_REPO names a vLLM clone holding that commit."""
    repo = os.environ.get("BISECTOR_REAL_IMAGE_REPO")
    if not repo:
        pytest.skip("set BISECTOR_REAL_IMAGE_REPO to a vLLM clone whose HEAD has a rocm/vllm-ci image")
    out = tmp_path / "o.json"
    done = cli("scenario", "run", "command", "--repo", repo, "--ref", "HEAD", "--state-dir", str(tmp_path / "s"),
               "--image", "rocm/vllm-ci:{commit}", "--json", str(out), "--", "python3", "-c",
               "import torch, vllm; assert torch.cuda.is_available(); print(vllm.__version__)", timeout=3600)
    record = json.loads(out.read_text())
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert record["details"]["image"]["proof"].startswith("holds ")
