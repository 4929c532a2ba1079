"""Performance hunts in the other worlds a step runs in: with --image each run is measured inside its commit's
container (the fake docker of tests/fakes/docker); with --aiter pinned against each commit's pinned AITER,
built and installed for real (test_aiter_pinned's stand-in); and the metric it prints reaches the hunt."""
import json

import pytest
from fakes.containers import FakeDocker
from test_aiter_pinned import stand_in  # noqa: F401
from test_images import TEMPLATE, history, publish, scenario_runs

pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")

pytestmark = pytest.mark.integration

CULPRIT = 5
# the image's vllm is imported (the checkout left off the path): 8 % slower where it is broken, 1 % noise
MEASURE = ("import os, random, sys\n"
           "sys.path = [entry for entry in sys.path if entry not in ('', os.getcwd())]\n"
           "import vllm\n"
           "assert 'site' in vllm.__file__, vllm.__file__\n"
           "speed = 1000 * (0.92 if vllm.BROKEN else 1.0) * (1 + random.gauss(0, 0.01))\n"
           "print(f'BISECTOR_METRIC tok_s={speed:.2f}')\n")


def test_a_perf_hunt_with_image_measures_each_run_in_its_commits_container(make_repo, tmp_path, cli):
    docker = FakeDocker(tmp_path / "fake")
    repo, shas = history(make_repo, count=8, culprit=CULPRIT)
    publish(docker, shas, range(8), culprit=CULPRIT)
    out = tmp_path / "r.json"
    run = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"), "--image", TEMPLATE, "--metric", "tok_s", "--higher-is-better",
              "--json", str(out), "--", "python3", "-c", MEASURE, env=docker.env)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["culprit"]["sha"] == shas[CULPRIT]
    perf = result["perf"]
    assert -0.1 < perf["change"]["relative"] < -0.06
    samples = [value for entry in perf["commits"] for value in entry["samples"]]
    assert len(samples) == result["executions"] == len([argv for argv in docker.runs() if MEASURE in argv])
    assert not scenario_runs(docker)


# the stand-in AITER's kernel: 8 % slower in v0.1.13 (the pin from commit 5 on), 1 % noise
MEASURE_AITER = ("import random, aiter\n"
                 "speed = 1000 * (0.92 if aiter.KERNEL == 'bad' else 1.0) * (1 + random.gauss(0, 0.01))\n"
                 "print(f'BISECTOR_METRIC tok_s={speed:.2f}')\n")


def test_a_perf_hunt_with_aiter_pinned_measures_each_commit_with_its_pinned_aiter(
        stand_in, tmp_path, cli, wheel_build):  # noqa: F811
    vllm, shas = stand_in
    out = tmp_path / "r.json"
    run = cli("run", "--repo", str(vllm.path), "--good", shas[0], "--bad", shas[-1], "--aiter", "pinned",
              "--state-dir", str(tmp_path / "state"), "--metric", "tok_s", "--higher-is-better", "--json", str(out),
              "--", "python3", "-c", MEASURE_AITER, timeout=900)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["culprit"]["sha"] == shas[5]
    assert result["pin_change"]["from"] == "v0.1.12" and result["pin_change"]["to"] == "v0.1.13"
    perf = result["perf"]
    assert -0.1 < perf["change"]["relative"] < -0.06
    for entry in perf["commits"]:
        assert entry["samples"] and entry["runs"] == len(entry["samples"])
        assert (entry["median"] < 960) == (shas.index(entry["sha"]) >= 5)
