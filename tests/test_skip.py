"""`bisector run --skip REV` / `--skip-file PATH`: commits never tested, as git bisect skip."""
import json

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def history(make_repo):
    """A linear history of 8 commits whose fault comes in with commit 4."""
    repo = make_repo()
    return repo, repo.linear(8, bad_from=4)


def _tested(log) -> set[int]:
    """The commits (by index) the scenario ran on, from the counter each run appended."""
    return {int(line) for line in log.read_text().split()} if log.exists() else set()


def _judging(log) -> list[str]:
    """A scenario that records which commit it ran on, then judges by the `state` file."""
    return ["sh", "-c", f"cat counter.txt >> '{log}'; grep -q good state"]


def test_skipped_range_leaves_candidates_without_testing_them(history, tmp_path, cli):
    repo, shas = history
    log, out = tmp_path / "tested", tmp_path / "result.json"
    plain = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                "--state-dir", str(tmp_path / "plain"), "--", *_judging(tmp_path / "plain.log"))
    assert plain.returncode == 0, plain.stderr
    assert f"first bad commit: {shas[4]}" in plain.stdout

    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--skip", f"{shas[2]}..{shas[5]}",
               "--json", str(out), "--", *_judging(log))
    assert proc.returncode == 1, proc.stderr
    result = json.loads(out.read_text())
    assert result["skipped_by_user"] == shas[3:6]
    assert set(result["candidates"]) == set(shas[3:7])
    assert _tested(log).isdisjoint({3, 4, 5})
    assert {step["sha"] for step in result["steps"]}.isdisjoint(shas[3:6])
    assert "skipped by --skip: 3 commits" in proc.stdout
    assert repo.snapshot() == before


def test_skip_file_takes_revs_and_ranges_with_comments(history, tmp_path, cli):
    repo, shas = history
    log, out = tmp_path / "tested", tmp_path / "result.json"
    skips = tmp_path / "skips"
    skips.write_text(f"# broken builds\n\n{shas[2]}..{shas[4]}\n   \n{shas[5]}  # no wheel\n")
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--skip-file", str(skips),
               "--json", str(out), "--", *_judging(log))
    assert proc.returncode == 1, proc.stderr
    assert json.loads(out.read_text())["skipped_by_user"] == shas[3:6]
    assert _tested(log).isdisjoint({3, 4, 5})


def test_plan_counts_skipped_commits(history, tmp_path, cli, state_is_good):
    repo, shas = history
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--skip", shas[3],
               "--skip", shas[4], "--plan", "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert "skipped by --skip: 2 commits" in proc.stdout
    assert shas[3][:12] not in proc.stdout and shas[4][:12] not in proc.stdout


@pytest.mark.parametrize("skip, says", [("ENDPOINT", "--bad endpoint"), ("no-such-ref", "no-such-ref")])
def test_endpoint_or_unknown_rev_is_refused(history, tmp_path, cli, skip, says):
    repo, shas = history
    log = tmp_path / "tested"
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--skip", shas[-1] if skip == "ENDPOINT" else skip, "--", *_judging(log))
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("bisector: error: --skip") and says in errors[0], proc.stderr
    assert not log.exists()
    assert repo.snapshot() == before
    assert not (repo.path / ".git" / "bisector").exists()


def test_run_key_holds_the_skip_set(tmp_path):
    from bisector.engine.config import RunConfig
    from bisector.engine.run import run_key
    from scenarios.command import CommandScenario

    cfg = RunConfig(repo=tmp_path, good="a", bad="b", scenario=CommandScenario(["true"]))
    plain = run_key(cfg, ["a"], "b", "judge")
    assert run_key(cfg, ["a"], "b", "judge", ("c", "d")) == run_key(cfg, ["a"], "b", "judge", ("d", "c"))
    assert run_key(cfg, ["a"], "b", "judge", ("c",)) not in (plain, run_key(cfg, ["a"], "b", "judge", ("d",)))
    assert run_key(cfg, ["a"], "b", "judge", ()) == plain
