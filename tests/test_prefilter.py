"""Two-tier search: the CPU probe localizes, the expensive scenario confirms (2 executions when both agree)."""
import importlib.util
import json

import pytest

from scenarios.aiter_mla_probe.demo import make_demo_repo

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the probe needs torch")]


def expensive(tmp_path, bad_from_index: int):
    """A -- CMD stand-in for the GPU scenario that counts its executions: bad from commit bad_from_index on."""
    script = tmp_path / "expensive.sh"
    script.write_text(f"#!/bin/sh\necho run >> {tmp_path}/executions\n"
                      f"[ $(git rev-list --count HEAD) -gt {bad_from_index} ] && exit 1\nexit 0\n")
    script.chmod(0o755)
    return str(script)


def executions(tmp_path) -> int:
    return len((tmp_path / "executions").read_text().splitlines())


@pytest.mark.parametrize("bad_from, agrees", [(10, True), (13, False)])
def test_prefilter_localizes_and_the_expensive_tier_confirms(tmp_path, bad_from, agrees, cli):
    good, bad, planted = make_demo_repo(tmp_path / "repo", commits=16, culprit_index=10)
    out = cli("run", "--repo", str(tmp_path / "repo"), "--good", good, "--bad", bad,
                   "--prefilter", "aiter-mla-probe", "--state-dir", str(tmp_path / "state"), "--reuse-verdicts",
                   "--json", str(tmp_path / "result.json"), "--", expensive(tmp_path, bad_from))
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["prefilter"]["culprit"] == planted
    assert result["prefilter"]["scenario"].startswith("aiter-mla-probe/")
    assert result["prefilter"]["executions"] >= 2 and result["prefilter"]["steps"]
    assert result["seeded"]["prefilter"] == planted and result["seeded"]["confirmed"] is agrees
    if agrees:
        assert result["first_bad"]["sha"] == planted
        assert executions(tmp_path) == result["executions"] == 2  # the culprit and its parent, nothing else
        assert [s["role"] for s in result["steps"]] == ["seed", "seed"]
    else:
        assert result["first_bad"]["subject"] == "Docs: note 13"
        assert executions(tmp_path) == result["executions"] > 2
    assert f"prefilter aiter-mla-probe: culprit {planted[:12]}" in out.stdout

    again = cli("run", "--repo", str(tmp_path / "repo"), "--good", good, "--bad", bad,
                     "--prefilter", "aiter-mla-probe", "--state-dir", str(tmp_path / "state"), "--reuse-verdicts", "--",
                     expensive(tmp_path, bad_from))
    assert again.returncode == 0 and executions(tmp_path) == result["executions"]  # both tiers cached


def test_prefilter_usage_errors(tmp_path, cli):
    good, bad, _ = make_demo_repo(tmp_path / "repo", commits=5, culprit_index=2)
    for extra, message in ((["--prefilter", "nope", "--", "true"], "unknown scenario 'nope'"),
                           (["--prefilter-option", "heads=16", "--", "true"], "--prefilter-option needs"),
                           (["--prefilter", "aiter-mla-probe", "--fix", bad, "--", "true"], "without --fix")):
        out = cli("run", "--repo", str(tmp_path / "repo"), "--good", good, "--bad", bad,
                       "--state-dir", str(tmp_path / "state"), *extra)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr
