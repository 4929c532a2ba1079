"""Hostile rows (issue 45 items 12, 13, 23, 25, 26): what the tool says must be true and usable as said — a skip
is no evidence, a printed command runs as printed, a cached answer says it is cached, a stop says what it waits
for, a verdict whose probe failed on the way says so."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from helpers.terminal import AS_A_FOREGROUND_JOB

from bisector.errors import EXIT_INCONCLUSIVE, EXIT_INTERRUPTED

pytestmark = pytest.mark.integration

# --- item 12: a skip on the fix check is "could not test the fix", never "the fix does not fix" ---------------

# The scenario: skip where `skipme` exists, bad where `state` says bad, good otherwise.
SKIPPING = "test -e skipme && exit 125; grep -q bad state && exit 1; exit 0"


@pytest.mark.parametrize("skips, said", [
    ("fix", "could not test the fix: its parent {parent} is bad and the fix skipped (exit 125 (skip))"),
    ("parent", "could not test the fix: its parent {parent} skipped (exit 125 (skip)), so whether the fix is "
               "exercised is not known"),
])
def test_a_skipped_fix_check_says_it_could_not_test_the_fix(make_repo, tmp_path, cli, skips, said):
    repo = make_repo()
    repo.commit("c0", {"state": "good\n"})
    repo.commit("the bug", {"state": "bad\n"})
    repo.git("branch", "rel")
    if skips == "parent":
        repo.commit("a commit the scenario cannot judge", {"skipme": ""})
    parent = repo.head()
    fix = repo.commit("the fix", {"state": "good\n", "skipme": "" if skips == "fix" else None})
    junit = tmp_path / "r.xml"
    proc = cli("backport", "--repo", str(repo.path), "--fix", fix, "--branches", "rel", "--junit", str(junit),
               "--", "sh", "-c", SKIPPING)
    assert proc.returncode == EXIT_INCONCLUSIVE, proc.stdout + proc.stderr
    assert f"! {said.format(parent=parent[:12])}" in proc.stdout.splitlines(), proc.stdout
    assert "does not fix" not in proc.stdout + proc.stderr
    [case] = [case for case in ET.parse(junit).getroot() if case.get("name") == "the fix"]
    assert case.find("failure") is None and case.find("error").get("type") == "fix-untested"


# --- item 13: the resume command `mark` prints runs as printed -------------------------------------------------

BLOCKING = ('n=$(cat counter.txt); echo ran >> "{d}/ran-$n"; '
            'if [ "$n" != 0 ] && [ "$n" != 7 ] && [ ! -e "{d}/release" ]; then '
            'echo "$n" > "{d}/blocked.tmp" && mv "{d}/blocked.tmp" "{d}/blocked"; '
            'while [ ! -e "{d}/release" ]; do sleep 0.05; done; fi; grep -q good state')


def _blocked_run(repo, tmp_path, env, wait_for, bisector=(sys.executable, "-m", "bisector.cli")):
    """A run of 8 commits (bad from 5) through `sh -c SCRIPT` (words a shell must get quoted), started as
    `bisector` and left with its first probe blocked. Returns (the process, the shas, the probe's index)."""
    shas = repo.linear(8, bad_from=5)
    argv = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--json",
            str(tmp_path / "r.json"), "--", "sh", "-c", BLOCKING.format(d=tmp_path)]
    proc = subprocess.Popen([*bisector, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    blocked = tmp_path / "blocked"
    assert wait_for(lambda: blocked.exists() or proc.poll() is not None) and proc.poll() is None
    return proc, shas, int(blocked.read_text())


def test_the_resume_command_mark_prints_resumes_the_run_with_the_mark_when_pasted_into_a_shell(
        make_repo, tmp_path, cli, git_env, project_root, wait_for):
    bin_dir = tmp_path / "bin"  # `bisector` as an installed console script is
    bin_dir.mkdir()
    (bin_dir / "bisector").write_text(f'#!/bin/sh\nexec {sys.executable} -m bisector.cli "$@"\n')
    (bin_dir / "bisector").chmod(0o755)
    env = {**os.environ, **git_env, "PYTHONPATH": str(project_root),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    repo = make_repo()
    first, shas, probe = _blocked_run(repo, tmp_path, env, wait_for, bisector=("bisector",))
    first.send_signal(signal.SIGTERM)
    _, said = first.communicate(timeout=120)
    assert first.returncode == EXIT_INTERRUPTED, said
    run_id = json.loads((tmp_path / "r.json").read_text())["run_id"]
    for ran in tmp_path.glob("ran-*"):
        ran.unlink()
    (tmp_path / "release").touch()

    wrong = "bad" if probe < 5 else "good"  # the opposite of what it tests: the answer shows the mark was used
    marked = cli("mark", "latest", shas[probe], wrong, "--repo", str(repo.path))
    assert marked.returncode == 0, marked.stderr
    line = marked.stdout.strip()
    printed = line[line.index("`") + 1:line.rindex("`")]
    resumed = subprocess.run(["sh", "-c", printed], capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, (printed, resumed.stderr)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["resumed_from"] == run_id
    [step] = [step for step in result["steps"] if step["sha"] == shas[probe]]
    assert step["manual"] is True and step["verdict"] == wrong
    assert not (tmp_path / f"ran-{probe}").exists()  # the marked commit was not tested again


# --- item 25: a Ctrl-C says at once that it is stopping, and what for --------------------------------------------

def test_ctrl_c_says_at_once_on_stderr_that_it_is_stopping_and_what_it_waits_for(
        make_repo, tmp_path, git_env, project_root, wait_for):
    repo = make_repo()
    proc, _, _ = _blocked_run(repo, tmp_path, {**os.environ, **git_env, "PYTHONPATH": str(project_root)}, wait_for,
                              bisector=(sys.executable, *AS_A_FOREGROUND_JOB, "-m", "bisector.cli"))
    proc.send_signal(signal.SIGINT)
    lines = []
    for line in proc.stderr:  # the output as it comes: the stop's first word is said before its cleanup ends
        lines.append(line.rstrip("\n"))
        if line.startswith("bisector: stopping"):
            break
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, lines
    assert lines[-1] == ("bisector: stopping (Ctrl-C): ending 1 running step, then saving the verdicts so far in "
                         "the record and removing the run's worktrees …"), lines
    assert "bisector: interrupted; verdicts so far are kept" in rest  # said after it, as the command ends


# --- item 26: a probe whose builder raised after sizing says so in its reason, or gives no verdict ---------------

TARGET = "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
GRAPHS = "        if self.compilation_config.cudagraph_mode.has_full_cudagraphs():\n"  # the first: in __init__
PREFILL_BUFFERS = "    def _init_fp8_prefill_ps_buffers(\n"
RESIZING = ("    def _resize_decode_metadata(self):\n        from aiter import get_mla_metadata_info_v1\n\n"
            "        return get_mla_metadata_info_v1(16, 1, 128, None, None)\n\n")
RAISED = ("AiterMLAMetadataBuilder then raised ValueError: not enough values to unpack (expected 6, got 0) in "
          "_init_fp8_prefill_ps_buffers (vllm/v1/attention/backends/mla/rocm_aiter_mla.py:")


@pytest.mark.slow
@pytest.mark.parametrize("version, options, verdict, reason_start", [
    ("0.25.0", {}, "good", "consistent: metadata sized for q fp8"),
    ("0.24.0", {"heads": "16"}, "good", "q dtype mismatch without effect"),
    ("0.24.0", {}, "bad", "q dtype mismatch changes AITER tiling"),
    ("0.25.0 resizing after", {}, "skip", "AiterMLAMetadataBuilder raised ValueError: not enough values to unpack"),
])
def test_a_gfx950_probe_whose_builder_raised_after_sizing_says_why_its_verdict_stands(
        vllm_sources, tmp_path, version, options, verdict, reason_start):
    import shutil

    pytest.importorskip("torch")
    from scenarios.aiter_mla_probe import AiterMLAProbe
    from scenarios.base import StepContext

    tree = vllm_sources(version.split()[0])
    if version.endswith("resizing after"):  # the builder sizes the metadata again after the prefill buffers
        shutil.copytree(tree, tmp_path / "vllm")
        tree, target = tmp_path / "vllm", tmp_path / "vllm" / TARGET
        source = target.read_text()
        assert source.count(PREFILL_BUFFERS) == 1 and GRAPHS in source
        target.write_text(source.replace(GRAPHS, "        self._resize_decode_metadata()\n\n" + GRAPHS, 1)
                          .replace(PREFILL_BUFFERS, RESIZING + PREFILL_BUFFERS))
    log = tmp_path / "probe.log"
    outcome = AiterMLAProbe({"arch": "gfx950", **options}).run(StepContext(checkout=tree, log_path=log,
                                                                           python=sys.executable))
    assert "Traceback" in log.read_text() and "_init_fp8_prefill_ps_buffers" in log.read_text()
    assert (outcome.verdict.value, outcome.reason[:len(reason_start)]) == (verdict, reason_start), outcome.reason
    if verdict == "skip":
        assert "sizes it again: the sizing seen may not be the one it keeps" in outcome.reason
    else:
        assert RAISED in outcome.reason and outcome.reason.endswith(
            "after sizing the decode metadata: nothing it had left to run sizes it again, so the verdict stands")


# --- item 23: an answer from the record says so, and costs nothing --------------------------------------------

def _release_branches(repo, count: int = 3) -> str:
    """main: good, then the bug, a release branch per commit after it, then the fix; returns the fix."""
    repo.commit("c0", {"state": "good\n"})
    repo.commit("the bug", {"state": "bad\n"})
    for n in range(count):
        repo.commit(f"release work {n}", {f"notes-{n}": "x\n"})
        repo.git("branch", f"rel/v{n}")
    return repo.commit("the fix", {"state": "good\n"})


@pytest.mark.parametrize("pruned", [False, True], ids=["picks kept", "picks pruned"])
def test_a_backport_rerun_from_the_record_says_cached_and_redoes_no_pick(make_repo, tmp_path, cli, pruned):
    repo = make_repo()
    fix = _release_branches(repo)
    ran = tmp_path / "ran"
    argv = ["backport", "--repo", str(repo.path), "--fix", fix, "--branches", "rel/*", "--reuse-verdicts",
            "--json", str(tmp_path / "r.json"), "--", "sh", "-c", f'echo x >> "{ran}"; grep -q good state']
    first = cli(*argv)
    assert first.returncode == 0, first.stderr
    assert "cached" not in first.stdout + first.stderr
    if pruned:  # the picked commits are unreachable: gone after a gc, so the picks must be made again
        repo.git("reflog", "expire", "--expire=now", "--all")
        repo.git("gc", "-q", "--prune=now")
    ran.unlink()
    again = cli(*argv)
    assert again.returncode == 0, again.stderr
    assert not ran.exists()  # no scenario ran
    said = "cached: before, after" if pruned else "cached: before, pick, after"
    result = json.loads((tmp_path / "r.json").read_text())
    assert [entry["cached"] for entry in result["branches"]] == [said.removeprefix("cached: ").split(", ")] * 3
    assert result["executions"] == 0
    for n in range(3):
        assert f"rel/v{n}: verified (scenario bad before the pick, good after it; {said})" in again.stderr
        assert any(line.startswith(f"rel/v{n} ") and line.endswith(f"({said})") for line in again.stdout.splitlines())
    assert again.stdout.rstrip().endswith("3 branches: 3 verified; nothing ran: every verdict came from the record")


def test_a_plan_of_a_hunt_the_record_answers_costs_nothing_and_its_columns_stay_apart(
        make_repo, tmp_path, cli, state_is_good):
    import re

    repo = make_repo()
    shas = repo.linear(16, bad_from=9)
    argv = ["run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--reuse-verdicts"]
    fresh = cli(*argv, "--plan", "--", *state_is_good)
    assert fresh.returncode == 0, fresh.stderr
    assert cli(*argv, "--", *state_is_good).returncode == 0
    planned = cli(*argv, "--plan", "--", *state_is_good)
    assert planned.returncode == 0, planned.stderr
    for plan, cached in ((fresh.stdout, False), (planned.stdout, True)):
        steps = [line for line in plan.splitlines() if re.match(r"  [0-9a-f]{12}", line)]
        assert len(steps) == 5, plan
        cells = [re.split(r" {2,}", line.strip()) for line in steps]
        assert all(len(row) == 4 for row in cells), plan  # sha, role, build, reason: never run together
        starts = {line.index(row[2], len(row[0]) + len(row[1])) for line, row in zip(steps, cells)}
        assert len(starts) == 1, plan  # the build column is aligned
        if cached:
            answered = [row for row in cells if row[2] == "cached"]
            assert len(answered) >= 4 and all(row[3].endswith(" in the record: nothing runs") for row in answered)
    assert re.search(r"^time: about 0 s of steps to the answer \(0 endpoint rounds and 0 more", planned.stdout, re.M)
    assert "probe rounds have their verdicts in the record: they cost nothing" in planned.stdout


# --- round three, item 14: a reason never splits a report's row -------------------------------------------------

@pytest.mark.parametrize("reason", ["first line\nsecond line", "a\r\nb", "colour \x1b[31mred", "tab\there", "del\x7f"],
                         ids=["newline", "CRLF", "escape", "tab", "DEL"])
def test_mark_refuses_a_reason_with_a_control_character(make_repo, tmp_path, cli, hostile, reason):
    import sqlite3

    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    stopped = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
                  "--", "false")  # GOOD tests bad: the run stops at its endpoint check, a run that takes marks
    assert stopped.returncode != 0, stopped.stdout
    marked = cli("mark", "latest", shas[1], "skip", "--reason", reason, "--repo", str(repo.path),
                 "--state-dir", str(state))
    assert "--reason" in hostile.one_line_error(marked) and "one line" in marked.stderr
    with sqlite3.connect(state / "bisector.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM marks").fetchone() == (0,)


def test_a_stored_reason_with_a_newline_stays_on_its_steps_row(make_repo, tmp_path, cli):
    import sqlite3

    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--no-verify-endpoints", "--", "sh", "-c", "grep -q good state")
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(state / "bisector.sqlite") as db:  # as a record another writer left it
        db.execute("UPDATE runs SET result = replace(result, '\"reason\": \"exit 1\"', "
                   "'\"reason\": \"exit 1\\nforged: a row\\rof its own\\u2028and more\"')")
    shown = cli("report", "1", "--repo", str(repo.path), "--state-dir", str(state), "--format", "text")
    assert shown.returncode == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if "exit 1" in line]
    assert row.startswith(f"  {shas[1][:12]}") and row.endswith("exit 1 forged: a row of its own and more"), row
    assert not any(line.startswith("forged") for line in shown.stdout.splitlines()), shown.stdout


# --- round three, item 15: a bad --skip-file entry is named by its file and line ----------------------------------

@pytest.mark.parametrize("entry, named", [
    ("notarev", "notarev"), ("{good}..notarev", "notarev"), ("notarev..{good}", "notarev"), ("--all", "--all"),
], ids=["a word", "a range's end", "a range's start", "an option"])
def test_a_bad_skip_file_entry_is_refused_by_file_and_line_before_any_work(make_repo, tmp_path, cli, hostile,
                                                                         entry, named):
    repo = make_repo()
    shas = repo.linear(4, bad_from=2)
    skips = tmp_path / "skips.txt"
    skips.write_text(f"# commits that do not build\n{shas[1]}\n\n{entry.format(good=shas[0])}  # why\n")
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--skip-file", str(skips), "--", "touch", str(tmp_path / "ran"))
    assert hostile.one_line_error(proc) == f"bisector: error: --skip-file {skips}:4: {named!r} is not a commit"
    assert not (tmp_path / "ran").exists() and not (state / "bisector.sqlite").exists()
