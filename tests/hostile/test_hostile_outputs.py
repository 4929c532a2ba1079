"""Hostile rows for the files commands write (issue 45, items 5, 6, 18, 22): outputs that are the record, its
journal or another file of the state dir (or a symlink or hard link to one), a directory, two outputs on one
file, a plot beside --json where a user's file stands, per-value report names built from values with '/', and
`report latest` after a run that stopped."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "helpers" / "perf_bench.py"
GREP_GOOD = ("--", "grep", "-q", "good", "state")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, repo_builder, cli):
    """A repository (6 commits, bad from 3) with one finished run in its default state dir <git dir>/bisector
    and one in a state dir of its own: (repo folder, state dir, shas)."""
    tmp = tmp_path_factory.mktemp("recorded")
    repo = repo_builder(tmp / "repo")
    shas = repo.linear(6, 3)
    for given in (("--state-dir", str(tmp / "state")), ()):
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], *given, *GREP_GOOD)
        assert proc.returncode == 0, proc.stderr
    return repo.path, tmp / "state", shas


@pytest.fixture
def copied(recorded, tmp_path):
    """The recorded repository and state dir, copied for one test: (repo folder, state dir, shas)."""
    repo, state, shas = recorded
    shutil.copytree(repo, tmp_path / "repo", symlinks=True)
    shutil.copytree(state, tmp_path / "state", symlinks=True)
    return tmp_path / "repo", tmp_path / "state", shas


def _bisect(repo: Path, shas: list[str], *options: str) -> tuple[str, ...]:
    return ("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], *options, *GREP_GOOD)


# what each command is asked to write over: (name, the output path from the test's tmp_path and state dir)
TOOL_FILES = [
    ("the record", lambda tmp, state: state / "bisector.sqlite"),
    ("its rollback journal", lambda tmp, state: state / "bisector.sqlite-journal"),
    ("its WAL", lambda tmp, state: state / "bisector.sqlite-wal"),
    ("its shared memory", lambda tmp, state: state / "bisector.sqlite-shm"),
    ("the run lock", lambda tmp, state: state / "lock"),
    ("a new file in the state dir", lambda tmp, state: state / "logs" / "mine.json"),
]


def _link(kind: str):
    def make(tmp: Path, state: Path) -> Path:
        link = tmp / f"{kind}.json"
        (os.symlink if kind == "symlink" else os.link)(state / "bisector.sqlite", link)
        return link
    return make


def run_json(repo: Path, state: Path, shas: list[str], out: Path) -> tuple[str, ...]:
    return _bisect(repo, shas, "--state-dir", str(state), "--json", str(out))


def report_o(repo: Path, state: Path, shas: list[str], out: Path) -> tuple[str, ...]:
    return ("report", "1", "--repo", str(repo), "--state-dir", str(state), "-o", str(out))


TARGETS = [*TOOL_FILES, ("a symlink to the record", _link("symlink")), ("a hard link to the record", _link("hard"))]


@pytest.mark.parametrize("command, what, target", [
    *((run_json, what, target) for what, target in TARGETS),
    *((report_o, what, target) for what, target in TARGETS),
    (lambda repo, state, shas, out: _bisect(repo, shas, "--state-dir", str(state), "--markdown", str(out)),
     *TOOL_FILES[0]),
    (lambda repo, state, shas, out: ("report", "1", "--repo", str(repo), "--state-dir", str(state), "--format",
                                     "html", "--output", str(out)), *TOOL_FILES[0]),
], ids=[*(f"run --json: {what}" for what, _ in TARGETS), *(f"report -o: {what}" for what, _ in TARGETS),
        "run --markdown: the record", "report --format html --output: the record"])
def test_an_output_into_the_state_dir_is_refused_before_anything_runs(copied, tmp_path, cli, hostile, command,
                                                                      what, target):
    """Item 5: `--json`/`--markdown`/`report -o` at the record overwrote it (6 verdicts lost, exit 5 after)."""
    repo, state, shas = copied
    out = target(tmp_path, state)
    before = hostile.tree_listing(state)
    line = hostile.one_line_error(cli(*command(repo, state, shas, out)))
    assert f"{out}: would write into the state dir {state}" in line, line
    assert hostile.tree_listing(state) == before
    assert cli("runs", "--repo", str(repo), "--state-dir", str(state)).returncode == 0


@pytest.mark.parametrize("command", [
    lambda repo, shas, out: _bisect(repo, shas, "--json", str(out)),
    lambda repo, shas, out: ("backport", "--repo", str(repo), "--fix", shas[3], "--branches", "main",
                             "--junit", str(out), *GREP_GOOD),
    lambda repo, shas, out: ("scenario", "run", "command", "--repo", str(repo), "--ref", shas[0],
                             "--json", str(out), *GREP_GOOD),
], ids=["run --json", "backport --junit", "scenario run --json"])
def test_the_default_state_dir_and_git_own_files_are_refused_as_outputs(copied, cli, hostile, command):
    """Item 5 with no --state-dir: the record is <git dir>/bisector/bisector.sqlite; git's own files beside it
    (its config, HEAD) are no outputs either."""
    repo, _, shas = copied
    git_dir = repo / ".git"
    before = hostile.tree_listing(git_dir)
    for out, said in ((git_dir / "bisector" / "bisector.sqlite", "would write into the state dir"),
                      (git_dir / "config", "would write into git's directory")):
        line = hostile.one_line_error(cli(*command(repo, shas, out)))
        assert f"{out}: {said}" in line, line
    assert hostile.tree_listing(git_dir) == before


def _hunt(repo: Path, shas: list[str], tmp: Path, *outputs: str) -> tuple[str, ...]:
    return ("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(tmp / "state"),
            *outputs, "--metric", "tok_s", "--higher-is-better", "--", sys.executable, str(BENCH),
            "--runs-dir", str(tmp / "runs"), "--seed", "11")


@pytest.fixture
def perf_repo(make_repo):
    pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")
    repo = make_repo("perf")
    return repo.path, repo.linear(8, 5)


@pytest.mark.parametrize("plot, made", [
    ("a user's file", lambda path: path.write_text("<svg>the user's own drawing</svg>\n")),
    ("a directory", lambda path: (path.mkdir(), (path / "keep.txt").write_text("mine\n"))),
    ("a symlink to a user's file", lambda path: (path.with_name("theirs.svg").write_text("theirs\n"),
                                                 path.symlink_to(path.with_name("theirs.svg")))),
], ids=lambda value: value if isinstance(value, str) else "")
def test_the_plot_beside_the_json_never_overwrites_what_is_there(perf_repo, tmp_path, cli, hostile, plot, made):
    """Item 6: the SVG a hunt writes beside --json overwrote a user's file of that name; a directory there made
    the run print its answer and then exit 2 (its reports lost). Both are refused before the hunt starts."""
    repo, shas = perf_repo
    made(tmp_path / "out.svg")
    before = hostile.tree_listing(tmp_path)
    proc = cli(*_hunt(repo, shas, tmp_path, "--json", str(tmp_path / "out.json")))
    line = hostile.one_line_error(proc)
    assert line.startswith(f"bisector: error: --json's plot {tmp_path / 'out.svg'}: "), line
    assert proc.stdout == "" and not (tmp_path / "state").exists() and not (tmp_path / "runs").exists()
    assert hostile.tree_listing(tmp_path) == before


def test_a_hunt_rewrites_its_own_plot_and_names_it_beside_any_json_name(perf_repo, tmp_path, cli):
    """Item 6: the plot is the tool's own file (it carries the tool's mark): the same command again rewrites it;
    a --json not ending in .json gets .svg added (out.result → out.result.svg, never out.svg)."""
    repo, shas = perf_repo
    (tmp_path / "out.svg").write_text("the user's\n")
    for _ in range(2):
        proc = cli(*_hunt(repo, shas, tmp_path, "--json", str(tmp_path / "out.result")))
        assert proc.returncode == 0, proc.stderr
        assert ET.fromstring((tmp_path / "out.result.svg").read_text()).tag == "{http://www.w3.org/2000/svg}svg"
    assert (tmp_path / "out.svg").read_text() == "the user's\n"


@pytest.mark.parametrize("outputs, message", [
    (lambda tmp: ("--json", str(tmp / "one"), "--markdown", str(tmp / "one")), "--json writes that file too"),
    (lambda tmp: ("--json", str(tmp)), "is a directory"),
    (lambda tmp: ("--markdown", str(tmp / "a-file" / "out.md")), "is not a directory"),
], ids=["--json and --markdown one file", "--json a directory", "--markdown under a file"])
def test_every_output_is_checked_before_the_run_starts(copied, tmp_path, cli, hostile, outputs, message):
    repo, state, shas = copied
    (tmp_path / "a-file").write_text("mine\n")
    before = hostile.tree_listing(state)
    line = hostile.one_line_error(cli(*_bisect(repo, shas, "--state-dir", str(state), *outputs(tmp_path))))
    assert message in line, line
    assert hostile.tree_listing(state) == before and not (tmp_path / "one").exists()


LONG = "/" + "/".join(["d" * 20] * 15)  # 315 characters; no path component too long for the file system


def _hashed(value: str, kept: str) -> str:
    """A value's part of a report name as docs/run.md says it: kept characters, '-', 8 hex of its sha256."""
    return f"{kept}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


@pytest.mark.parametrize("values, names", [
    (("/path/with/slashes.git", "/other/path.git"),
     (_hashed("/path/with/slashes.git", "path_with_slashes.git"), _hashed("/other/path.git", "other_path.git"))),
    (("a/b", "a_b"), (_hashed("a/b", "a_b"), "a_b")),
    (("../../escape", "é"), (_hashed("../../escape", ".._.._escape"), _hashed("é", ""))),
    ((LONG, "y"), (_hashed(LONG, "d" * 20 + "_" + "d" * 19), "y")),  # cut to 40 characters
], ids=["slashes", "a slash and its stand-in", "dot-dot and non-ASCII", "315 characters"])
def test_per_value_reports_get_safe_distinct_names(copied, tmp_path, cli, values, names):
    """Item 18: `--option aiter_repo=/path/with/slashes.git,...` raised `ValueError: Invalid name` (no report
    written). Each value's reports are named by a filesystem-safe part that never holds '/'."""
    repo, state, shas = copied
    listed = ",".join(values)
    proc = cli("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir",
               str(state), "--scenario", "aiter-mla-probe", "--option", f"aiter_repo={listed}",
               "--json", str(tmp_path / "out" / "run.json"), "--markdown", str(tmp_path / "out" / "run.md"))
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stderr  # the toy repository has no MLA backend: both runs stop at their ends
    expected = {f"run.aiter_repo={name}.{suffix}" for name in names for suffix in ("json", "md")}
    assert {path.name for path in (tmp_path / "out").iterdir()} == expected
    reports = [json.loads((tmp_path / "out" / f"run.aiter_repo={name}.json").read_text()) for name in names]
    assert [(report["outcome"], report["run_id"]) for report in reports] == [("endpoint", 2), ("endpoint", 3)]
    assert [line for line in proc.stdout.splitlines() if line.startswith("== ")] == \
        [f"== aiter_repo={value}" for value in values]  # the runs in the values' order: run 2 the first


def test_report_latest_is_the_last_run_that_ended_whatever_its_outcome(make_repo, tmp_path, cli):
    """Item 22: after a run that stopped (endpoint check failed) `report latest` showed the run before it (or
    said "no finished run") while `report RUN` worked."""
    built = make_repo()
    repo, state, shas = built.path, tmp_path / "state", built.linear(6, 3)
    found = cli(*_bisect(repo, shas, "--state-dir", str(state)))
    assert found.returncode == 0, found.stderr
    stopped = cli("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
                  "--", "sh", "-c", "exit 0")  # the bad end tests good: the run stops at its ends
    assert stopped.returncode == 3, stopped.stderr
    latest = cli("report", "latest", "--repo", str(repo), "--state-dir", str(state), "--format", "json")
    assert latest.returncode == 0, latest.stderr
    record = json.loads(latest.stdout)
    assert record["outcome"] == "endpoint" and record["run_id"] == 2
    assert cli("report", "latest", "--repo", str(repo), "--state-dir", str(state)).stdout == \
        cli("report", "2", "--repo", str(repo), "--state-dir", str(state)).stdout


def test_report_latest_says_when_no_run_has_ended_yet(tmp_path, cli, hostile):
    """Item 22: a run still in progress (or killed) is no run that ended; `latest` names it and says so."""
    from bisector.record.store import Store

    store = Store(tmp_path / "bisector.sqlite")
    run_id, _ = store.start_run("bisect", "k", {}, os.getpid())
    store.close()
    line = hostile.one_line_error(cli("report", "latest", "--state-dir", str(tmp_path), cwd=tmp_path))
    assert line.endswith(f"(run {run_id} has not ended: it is running, or was killed)"), line


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))  # the file stays when the socket is closed
    server.close()
    return path


def _dangling(path: Path) -> Path:
    path.symlink_to(path.parent / "gone" / "away.json")
    return path


# outputs no command may take (name, made from a fresh path in the test's tmp_path, what the line says)
NOT_FILES = [
    ("a FIFO", _fifo, "a FIFO"),
    ("a socket", _socket, "not a regular file"),
    ("/dev/full", lambda path: Path("/dev/full"), "not a regular file"),
    ("a symlink to a FIFO", lambda path: (_fifo(path.with_name("fifo")), path.symlink_to("fifo"), path)[-1],
     "a FIFO"),
    ("a dangling symlink", _dangling, "a symlink to"),
]
OUTPUT_COMMANDS = [
    ("run --json", lambda repo, state, shas, out: run_json(repo, state, shas, out)),
    ("backport --junit", lambda repo, state, shas, out: (
        "backport", "--repo", str(repo), "--fix", shas[3], "--branches", "main", "--state-dir", str(state),
        "--junit", str(out), *GREP_GOOD)),
    ("report -o", report_o),
]
SAID = {"run --json": "--json", "backport --junit": "--junit", "report -o": "--output"}  # the option each line names


@pytest.fixture
def drained():
    """drained(fifo): read whatever is written into fifo (so that a run writing its report there ends, and the
    row fails on its answer rather than hanging); the reader is let go at the end of the test."""
    import threading

    fifos: list[tuple[Path, threading.Thread]] = []

    def drain(fifo: Path) -> None:
        reader = threading.Thread(target=lambda: fifo.read_bytes(), daemon=True)
        reader.start()
        fifos.append((fifo, reader))
    yield drain
    for fifo, reader in fifos:
        if reader.is_alive():  # nobody opened it for writing: open it so that the reader sees its end
            os.close(os.open(fifo, os.O_WRONLY))
        reader.join()


@pytest.mark.parametrize("what, made, said", NOT_FILES, ids=[name for name, _, _ in NOT_FILES])
@pytest.mark.parametrize("name, command", OUTPUT_COMMANDS, ids=[name for name, _ in OUTPUT_COMMANDS])
def test_an_output_that_is_no_regular_file_is_refused_before_anything_runs(copied, tmp_path, cli, hostile,
                                                                           drained, name, command, what, made,
                                                                           said):
    """Attack round three: a FIFO as --json/--junit/-o hung the command at its end (after the whole run), and
    /dev/full or a dangling symlink failed only then. Each is refused in one line before any step runs."""
    repo, state, shas = copied
    out = made(tmp_path / "out.json")
    fifo = out.resolve() if out.resolve().is_fifo() else None
    if fifo is not None:
        drained(fifo)
    before = hostile.tree_listing(state)
    proc = cli(*command(repo, state, shas, out))
    line = hostile.one_line_error(proc)
    assert line.startswith(f"bisector: error: {SAID[name]} {out}: ") and said in line, line
    assert proc.stdout == "" and hostile.tree_listing(state) == before
    assert not (tmp_path / "gone").exists()


def _worktree_gitfile(repo: Path, tmp: Path) -> Path:
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", str(tmp / "linked")], check=True)
    return tmp / "linked" / ".git"


def _separate(tmp: Path) -> Path:
    """A repository whose git dir lies apart (as a submodule's does): its .git is a file `gitdir: ...`."""
    subprocess.run(["git", "init", "-q", "--separate-git-dir", str(tmp / "apart.git"), str(tmp / "other")],
                   check=True)
    return tmp / "other" / ".git"


@pytest.mark.parametrize("target", [
    lambda repo, tmp: _worktree_gitfile(repo, tmp),
    lambda repo, tmp: _separate(tmp),
    lambda repo, tmp: (_separate(tmp), tmp / "apart.git" / "config")[-1],
    lambda repo, tmp: (_separate(tmp), tmp / "apart.git" / "hooks" / "pre-commit")[-1],
], ids=["a linked worktree's .git file", "a separate git dir's .git file", "the config of the git dir it names",
        "a new hook in it"])
@pytest.mark.parametrize("name, command", OUTPUT_COMMANDS, ids=[name for name, _ in OUTPUT_COMMANDS])
def test_git_files_and_the_git_dirs_they_name_are_no_outputs(copied, tmp_path, cli, hostile, name, command,
                                                             target):
    """Attack round three: --json at a linked worktree's or a submodule's `.git` (a file, `gitdir: ...`) wrote
    over it (the worktree no longer a checkout); only .git directories were known."""
    repo, state, shas = copied
    out = target(repo, tmp_path)
    before = {place: hostile.tree_listing(place) for place in tmp_path.iterdir() if place.is_dir()}
    gitfile = out.read_bytes() if out.name == ".git" else None
    line = hostile.one_line_error(cli(*command(repo, state, shas, out)))
    assert f"{out}: " in line and "git's" in line, line
    assert {place: hostile.tree_listing(place) for place in before} == before
    assert gitfile is None or out.read_bytes() == gitfile


@pytest.mark.parametrize("repo_given", [None, "another"], ids=["no --repo", "--repo another repository"])
def test_report_checks_its_output_against_the_recorded_runs_repository(copied, tmp_path, make_repo, cli,
                                                                       hostile, repo_given):
    """Attack round three: `report -o` checked git's directory of --repo (default ".") only, so `report 1
    --state-dir S -o <the recorded repository>/.git/config` from elsewhere overwrote that config."""
    repo, state, _ = copied
    other = make_repo("another").path
    before = hostile.tree_listing(repo / ".git")
    given = ("--repo", str(other)) if repo_given else ()
    out = repo / ".git" / "config"
    line = hostile.one_line_error(cli("report", "1", *given, "--state-dir", str(state), "-o", str(out),
                                      cwd=tmp_path))
    assert f"{out}: would write into git's directory" in line, line
    assert hostile.tree_listing(repo / ".git") == before


@pytest.mark.parametrize("second", [
    lambda first: (os.link(first, first.with_name("hard.md")), first.with_name("hard.md"))[-1],
    lambda first: (first.parent.with_name("alias").symlink_to(first.parent), first.parent.with_name("alias")
                   / first.name)[-1],
], ids=["a hard link of --json", "--json through a symlinked folder"])
def test_two_outputs_on_one_file_by_other_names_are_refused(copied, tmp_path, cli, hostile, second):
    """Attack round three: two outputs were told apart by their resolved paths, so a hard link of --json given
    as --markdown was written twice (the JSON lost)."""
    repo, state, shas = copied
    (tmp_path / "out").mkdir()
    first = tmp_path / "out" / "run.json"
    first.write_text("the user's\n")
    markdown = second(first)
    before = hostile.tree_listing(state)
    line = hostile.one_line_error(cli(*_bisect(repo, shas, "--state-dir", str(state), "--json", str(first),
                                               "--markdown", str(markdown))))
    assert f"--markdown {markdown}: --json writes that file too" in line, line
    assert hostile.tree_listing(state) == before and first.read_text() == "the user's\n"


@pytest.mark.parametrize("out, said", [
    (lambda tmp: tmp / ("x" * 256 + ".json"), "longer than 255 bytes"),
    (lambda tmp: tmp / ("é" * 128 + ".json"), "longer than 255 bytes"),  # 128 letters, 256 bytes
    (lambda tmp: tmp.joinpath(*["d" * 200] * 21, "run.json"), "longer than 4095 bytes"),
], ids=["a 261-byte name", "a name of 128 two-byte letters", "a 4200-byte path"])
@pytest.mark.parametrize("name, command", OUTPUT_COMMANDS, ids=[name for name, _ in OUTPUT_COMMANDS])
def test_an_output_name_too_long_for_the_file_system_is_refused_in_one_line(copied, tmp_path, cli, hostile, name,
                                                                           command, out, said):
    """Attack round three: a name over NAME_MAX (255 bytes) or a path over PATH_MAX gave an OSError
    traceback (File name too long)."""
    repo, state, shas = copied
    path = out(tmp_path)
    before = hostile.tree_listing(state)
    line = hostile.one_line_error(cli(*command(repo, state, shas, path)))
    assert line.startswith(f"bisector: error: {SAID[name]} {path}: ") and said in line, line
    assert hostile.tree_listing(state) == before


def test_per_value_report_names_are_cut_to_fit_the_file_system(copied, tmp_path, cli):
    """Attack round three: each value's report name (--json's name with its value name inside) had no total
    cap: a --json of 200 characters made names over 255 bytes, and the run failed. A name that would be too
    long keeps what fits and ends its value part with 8 hex digits of the whole name: still distinct."""
    repo, state, shas = copied
    json_file = tmp_path / "out" / ("r" * 200 + ".json")
    proc = cli("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--scenario", "aiter-mla-probe", "--option", f"aiter_repo={'a' * 40},{'b' * 40}",
               "--json", str(json_file))
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 3, proc.stderr  # the toy repository has no MLA backend: both runs stop at their ends
    names = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert len(names) == 2 and all(len(name.encode()) <= 255 for name in names), names
    assert all(name.startswith("r" * 200 + ".aiter_repo=") and name.endswith(".json") for name in names), names
    reports = [json.loads((tmp_path / "out" / name).read_text()) for name in names]
    assert sorted(report["run_id"] for report in reports) == [2, 3]


@pytest.mark.parametrize("name, command", OUTPUT_COMMANDS, ids=[name for name, _ in OUTPUT_COMMANDS])
def test_the_null_device_stays_an_output_that_throws_the_report_away(copied, cli, name, command):
    """`--json /dev/null` is a habit (run for the exit code only): the null device is the one device taken."""
    repo, state, shas = copied
    proc = cli(*command(repo, state, shas, Path(os.devnull)))
    assert proc.returncode != 2 and "bisector: error" not in proc.stderr, proc.stderr  # the command's own answer
