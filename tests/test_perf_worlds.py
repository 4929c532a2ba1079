"""Performance hunts in the other worlds a step runs in: with --image each run is measured inside its commit's
container (the fake docker of tests/fakes/docker), and the metric it prints reaches the hunt."""
import json

import pytest
from fake_docker import FakeDocker
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
