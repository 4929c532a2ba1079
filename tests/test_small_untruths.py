"""Printed lines that said something untrue (issue 34 items 4 and 7), each checked on a real CLI run."""
import pytest
from helpers.terminal import AS_A_FOREGROUND_JOB

pytestmark = pytest.mark.integration


def test_progress_line_says_one_commit_left_in_the_singular(make_repo, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--", *state_is_good)
    assert proc.returncode == 0, proc.stderr
    assert "| 1 commit left, ~1 step to go |" in proc.stderr
    assert " commits left, ~" in proc.stderr  # more than one: the plural
    assert "1 commits" not in proc.stderr and "1 steps" not in proc.stderr


@pytest.mark.parametrize("page", ["docs/run.md", "docs/backport.md"])
def test_docs_list_exit_code_5_with_the_other_exit_codes(project_root, page):
    from bisector.errors import EXIT_RECORD

    codes = next(paragraph for paragraph in (project_root / page).read_text().split("\n\n")
                 if paragraph.startswith("Exit codes:"))
    assert f"; {EXIT_RECORD} the record file (`bisector.sqlite`) cannot be used" in codes


def test_aiter_named_by_its_own_sha_is_printed_once(make_repo):
    from dataclasses import asdict

    from scenarios.aiter_mla_probe.child import aiter_label
    from scenarios.aiter_mla_probe.sources import PACKAGE, checkout_aiter

    repo = make_repo("aiter")
    sha = repo.commit("kernels", {f"{PACKAGE}/__init__.py": ""})
    untagged = aiter_label(asdict(checkout_aiter(repo.path)))  # describe --always: an abbreviated sha
    assert untagged == f"AITER {sha[:10]}"
    repo.git("tag", "v0.1.13")
    assert aiter_label(asdict(checkout_aiter(repo.path))) == f"AITER v0.1.13 ({sha[:10]})"


def test_cancelled_step_is_said_on_the_progress_display(make_repo, tmp_path, cli, deciding_answer_kills_the_rest):
    repo = make_repo()
    shas = repo.linear(4, bad_from=1)
    script = tmp_path / "scenario.sh"
    script.write_text(f"n=$(cat counter.txt)\nPIDS={tmp_path}\n{deciding_answer_kills_the_rest}\n")
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[3], "--jobs", "2",
               "--", "sh", str(script))
    assert proc.returncode == 0, proc.stderr
    assert f"\n  {shas[2][:12]} cancelled (answer found elsewhere)\n" in proc.stderr


def test_cache_list_prints_a_table_and_json_gives_the_raw_records(make_repo, cli, state_is_good):
    import json

    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    assert cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[2], "--",
               *state_is_good).returncode == 0
    listed = cli("cache", "list", "--repo", str(repo.path))
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["COMMIT", "SCENARIO", "VERDICTS", "RUNS", "RECORDED", "KEY"]
    assert len(rows) == 3
    first = next(row for row in rows if row.startswith(shas[0][:12]))
    assert first.split()[1:4] == ["command", "good", "1"]
    assert "argv=\"grep -q good state\" build=none " in first and "{" not in listed.stdout
    raw = cli("cache", "list", "--repo", str(repo.path), "--commit", shas[2], "--json")
    assert raw.returncode == 0, raw.stderr
    [record] = json.loads(raw.stdout)
    assert record["sha"] == shas[2] and record["verdicts"] == "bad" and record["runs"] == 1
    assert record["scenario_key"].startswith("command/") and record["parts"]["argv"] == state_is_good


def test_interrupt_says_what_a_rerun_does_and_the_rerun_resumes(make_repo, tmp_path, git_env, project_root,
                                                                 wait_for):
    import json
    import os
    import signal
    import subprocess
    import sys

    repo = make_repo()
    shas = repo.linear(8, bad_from=5)
    release, blocked = tmp_path / "release", tmp_path / "blocked"
    script = tmp_path / "check.sh"
    script.write_text(  # the first probe after the two ends waits until released
        f'n=$(cat counter.txt)\nif [ "$n" != 0 ] && [ "$n" != 7 ] && [ ! -e {release} ]; then\n'
        f'  touch {blocked}; while [ ! -e {release} ]; do sleep 0.05; done\nfi\ngrep -q good state\n')
    out = tmp_path / "r.json"
    argv = [sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", shas[0], "--bad",
            shas[-1], "--json", str(out)]
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root)}
    first = subprocess.Popen([sys.executable, *AS_A_FOREGROUND_JOB, *argv[1:], "--no-cache", "--", "sh", str(script)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: blocked.exists() or first.poll() is not None) and first.poll() is None
    first.send_signal(signal.SIGINT)
    _, said = first.communicate(timeout=120)
    assert first.returncode == 130, said
    assert ("bisector: interrupted; verdicts so far are kept, without --no-cache the same command resumes and "
            "reuses them (with it, every commit is judged again)\n") in said
    assert "run the same command to resume" not in said
    interrupted = json.loads(out.read_text())
    release.touch()
    again = subprocess.run([*argv, "--", "sh", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"run {interrupted['run_id'] + 1}: 7 commits in range, resuming run {interrupted['run_id']}\n" \
        in again.stderr
    result = json.loads(out.read_text())
    assert result["resumed_from"] == interrupted["run_id"] and result["first_bad"]["sha"] == shas[5]
    assert {step["sha"] for step in result["steps"] if step["cached"]} == {shas[0], shas[-1]}  # reused, as said


def test_aiter_install_pinned_by_sha_names_the_sha_once(make_repo):
    from bisector.world.aiter import AiterBuild

    sha = make_repo("aiter").commit("kernels", {"aiter/__init__.py": ""})
    pinned = AiterBuild(ref=sha[:10], repo="aiter", commit=sha, arch="gfx950", torch="2.9.0", python="3.12",
                        prebuild=False)
    assert pinned.describe().startswith(f"AITER {sha[:10]} for gfx950, torch 2.9.0, Python 3.12, JIT: key ")
    tagged = AiterBuild(ref="v0.1.13", repo="aiter", commit=sha, arch="gfx950", torch="2.9.0", python="3.12",
                        prebuild=True)
    assert tagged.describe().startswith(f"AITER v0.1.13 ({sha[:10]}) for gfx950")
