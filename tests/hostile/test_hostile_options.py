"""Hostile rows for options (issue 45, items 20 and 24): every numeric option of every command refuses a
huge, negative, zero (where zero means nothing) or NaN value in one line, exit 2, nothing started; a file
option given /dev/zero, a FIFO, a directory or a huge file is refused the same way, never read without end;
`bisector runs` lists its runs under a header, with when each started and ended, within the terminal's width;
`run --help` and `backport --help` list their options in sections and end with examples and exit codes.
"""
from __future__ import annotations

import importlib
import os
import pty
import re
import resource
import shlex
import subprocess
import sys
import termios
import time

import click
import pytest

from bisector.cli import COMMANDS

pytestmark = pytest.mark.integration

HUGE = "99999999999999999999"
DIGITS = "9" * 5000  # past Python's int-from-string limit too
INT_BAD = (HUGE, "nan")
FLOAT_BAD = ("1e20", "nan")

# Every numeric option: (command words, option, words the command needs besides, values refused beyond
# INT_BAD / FLOAT_BAD: the negative and zero ones that mean nothing; 1e20, inf and 5000 digits once each).
# test_the_table_covers_every_numeric_option_and_each_has_a_maximum holds the table to the commands: a new
# numeric option lands with its row here.
STATE = ("--state-dir", "{state}")
RUN = ("--good", "HEAD~1", "--bad", "HEAD", *STATE)
CMD = ("--", "true")
BACKPORT = ("--fix", "HEAD", "--branches", "x", *STATE)
NUMERIC = [
    (("run",), "--timeout", (*RUN, *CMD), ("0", "-1", HUGE, "inf", "-inf")),
    (("run",), "--jobs", (*RUN, *CMD), ("0", "-1", "1e20", DIGITS)),
    (("run",), "--repeat", (*RUN, *CMD), ("0", "-1")),
    (("run",), "--confidence", (*RUN, "--flaky", *CMD), ("0", "1", "-1")),
    (("run",), "--fault-rate", (*RUN, "--flaky", *CMD), ("0", "1", "-1")),
    (("run",), "--max-runs-per-commit", (*RUN, "--flaky", *CMD), ("0", "-1")),
    (("run",), "--env-cache-size", (*RUN, *CMD), ("0", "-1")),
    (("run",), "--aiter-cache-size", (*RUN, *CMD), ("0", "-1")),
    (("run",), "--build-ahead", (*RUN, *CMD), ("-1",)),
    (("run",), "--gpus-per-run", (*RUN, *CMD), ("-1",)),
    (("run",), "--min-change", (*RUN, "--metric", "m", *CMD), ("-1",)),
    (("run",), "--warmup", (*RUN, "--metric", "m", *CMD), ("-1",)),
    (("run",), "--max-samples", (*RUN, "--metric", "m", *CMD), ("0", "5", "-1")),
    (("backport",), "--timeout", (*BACKPORT, *CMD), ("0", "-1")),
    (("backport",), "--env-cache-size", (*BACKPORT, *CMD), ("0", "-1")),
    (("backport",), "--aiter-cache-size", (*BACKPORT, *CMD), ("0", "-1")),
    (("scenario", "run"), "--timeout", ("command", *STATE, *CMD), ("0", "-1")),
    (("scenario", "run"), "--env-cache-size", ("command", *STATE, *CMD), ("0", "-1")),
    (("scenario", "run"), "--aiter-cache-size", ("command", *STATE, *CMD), ("0", "-1")),
    (("scenario", "calibrate"), "--runs", ("command", *RUN, *CMD), ("0", "-1")),
    (("scenario", "calibrate"), "--timeout", ("command", *RUN, *CMD), ("0", "-1")),
    (("scenario", "calibrate"), "--aiter-cache-size", ("command", *RUN, *CMD), ("0", "-1")),
    (("scenario", "classify"), "--exit-code", ("dpa-fp8-kv-graph-capture", "--log", "/dev/null"), ("256", "-65")),
    (("shell",), "--env-cache-size", ("--ref", "HEAD", *STATE), ("0", "-1")),
    (("shell",), "--aiter-cache-size", ("--ref", "HEAD", *STATE), ("0", "-1")),
    (("demo",), "--commits", (), ("0", "2", "-1")),
    (("demo",), "--culprit", (), ("0", "-1")),
]
FLOATS = {"--timeout", "--confidence", "--fault-rate", "--min-change"}

# Numbers inside other options: sizes (--image-cache-size is read with --image only), GPU lists, run ids.
WITH_SIZES = [(("run",), (*RUN, *CMD)), (("backport",), (*BACKPORT, *CMD)),
              (("scenario", "run"), ("command", *STATE, *CMD)), (("scenario", "calibrate"), ("command", *RUN, *CMD)),
              (("shell",), ("--ref", "HEAD", *STATE))]
SIZES = [*((command, option, needs) for command, needs in WITH_SIZES
           for option in ("--cache-size", "--image-cache-size")),
         *((command, "--log-limit", needs) for command, needs in WITH_SIZES[:3])]
# (argv, a fragment of the one line it prints)
OTHERS = [
    *[(["run", *RUN, "--gpus", value, *CMD], "bad GPU")
      for value in (f"0-{HUGE}", f"0:{HUGE}", HUGE, "0:65", DIGITS, "²")],
    *[(["report", value, *STATE], value[:20]) for value in (HUGE, "-1", DIGITS)],
    *[(["mark", value, "HEAD", "good", *STATE], value[:20]) for value in (HUGE, "-1", DIGITS)],
]  # `cache` takes no number (its --commit 99999999999999999999 is a sha prefix that matches nothing)


def rows() -> list:
    """The table's rows as pytest params: (argv, with {state} for the state dir; the fragment its line holds)."""
    found = [([*command, f"{option}={value}", *needs], option)
             for command, option, needs, refused in NUMERIC
             for value in (*(FLOAT_BAD if option in FLOATS else INT_BAD), *refused)]
    found += [([*command, *(("--image", "r/v:{{commit}}") if option == "--image-cache-size" else ()),
                f"{option}={value}", *needs], option)
              for command, option, needs in SIZES for value in (HUGE, "9" * 400)]
    return [pytest.param(argv, fragment, id=" ".join(_short(part) for part in argv if part not in STATE + RUN))
            for argv, fragment in [*found, *OTHERS]]


def _short(word: str) -> str:
    """A word of a row's id: a long one cut, with its length (rows of 20 and 400 digits stay apart)."""
    word = word.replace("{{", "{").replace("}}", "}")
    return word if len(word) <= 32 else f"{word[:28]}…({len(word)})"


@pytest.fixture(scope="module")
def world(tmp_path_factory, repo_builder, cli):
    """A repository of three commits and a state dir holding one finished run of it."""
    root = tmp_path_factory.mktemp("options")
    repo = repo_builder(root / "repo")
    repo.linear(3, bad_from=2)
    state = root / "state"
    done = cli("run", "--repo", str(repo.path), "--good", "HEAD~2", "--bad", "HEAD", "--state-dir", str(state),
               "--", "grep", "-q", "good", "state")
    assert done.returncode == 0, done.stderr
    return {"repo": repo, "root": root, "state": state}


def bounded_cli(project_root, git_env):
    """cli(*args, cwd=) with the address space capped at 2 GiB: a command that reads /dev/zero fails (or is
    refused) without taking the machine's memory with it; 60 s at most (a FIFO read waits for ever)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))

    def run(*args, cwd):
        return subprocess.run([sys.executable, "-m", "bisector.cli", *args], cwd=cwd, capture_output=True,
                              text=True, timeout=60, preexec_fn=limit,
                              env={**os.environ, **git_env, "PYTHONPATH": str(project_root)})
    return run


@pytest.mark.parametrize(("argv", "fragment"), rows())
def test_a_bad_number_is_one_line_and_exit_2_with_nothing_started(argv, fragment, world, hostile, project_root,
                                                                  git_env):
    before = (hostile.tree_listing(world["repo"].path), hostile.record_text(world["state"]))
    done = bounded_cli(project_root, git_env)(*(part.format(state=world["state"]) for part in argv),
                                              cwd=world["repo"].path)
    assert fragment in hostile.one_line_error(done)
    assert (hostile.tree_listing(world["repo"].path), hostile.record_text(world["state"])) == before


def numeric_options():
    """(command words, option) of every option of every command whose value is a number."""
    def walk(words, command):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk((*words, name), sub)
            return
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.types._NumberParamTypeBase):
                yield words, param
    for name, (module, attribute, _) in COMMANDS.items():
        yield from walk((name,), getattr(importlib.import_module(module), attribute))


def test_the_table_covers_every_numeric_option_and_each_has_a_maximum():
    found = {(words, param.opts[0]): param.type for words, param in numeric_options()}
    assert set(found) == {(command, option) for command, option, _, _ in NUMERIC}
    unbounded = [f"{' '.join(words)} {option}" for (words, option), kind in found.items()
                 if not isinstance(kind, click.types._NumberRangeBase) or kind.min is None or kind.max is None]
    assert unbounded == []


@pytest.fixture
def files(tmp_path):
    """The file-option inputs that must not be read without end: /dev/zero, a FIFO, a directory, a huge
    (sparse) file, past every option's cap."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "folder").mkdir()
    with open(tmp_path / "huge", "wb") as huge:
        huge.truncate(300 * 1024**2)
    return {"/dev/zero": "/dev/zero", "fifo": str(fifo), "folder": str(tmp_path / "folder"),
            "huge": str(tmp_path / "huge")}


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "folder", "huge"])
@pytest.mark.parametrize("argv", [["run", *RUN, "--skip-file", "{file}", *CMD],
                                  ["scenario", "classify", "dpa-fp8-kv-graph-capture", "--log", "{file}"]],
                         ids=["run --skip-file", "scenario classify --log"])
def test_a_file_option_never_reads_a_stream_or_a_huge_file(argv, kind, files, world, hostile, project_root,
                                                            git_env):
    before = (hostile.tree_listing(world["repo"].path), hostile.record_text(world["state"]))
    done = bounded_cli(project_root, git_env)(*(part.format(file=files[kind], state=world["state"]) for part in argv),
                                              cwd=world["repo"].path)
    line = hostile.one_line_error(done)
    assert ("--skip-file" if "run" in argv else "--log") in line
    assert (hostile.tree_listing(world["repo"].path), hostile.record_text(world["state"])) == before


def on_a_terminal(argv: list[str], columns: int, env: dict, cwd) -> str:
    """What argv prints on stdout when stdout is a terminal `columns` wide."""
    leader, follower = pty.openpty()
    termios.tcsetwinsize(follower, (24, columns))
    child = subprocess.Popen(argv, stdout=follower, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                             cwd=cwd)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert child.wait(timeout=120) == 0, child.stderr.read() if child.stderr else ""
    return shown.decode().replace("\r\n", "\n")


def test_runs_has_a_header_dates_and_fits_the_terminal_whole_into_a_pipe(world, cli, project_root, git_env):
    long_command = ["sh", "-c", "grep -q good state # " + "a long comment " * 30]
    done = cli("run", "--good", "HEAD~2", "--bad", "HEAD", "--state-dir", str(world["state"]), "--no-cache",
               "--", *long_command, cwd=world["repo"].path)
    assert done.returncode == 0, done.stderr
    argv = [sys.executable, "-m", "bisector.cli", "runs", "--state-dir", str(world["state"])]
    env = {key: value for key, value in {**os.environ, **git_env, "PYTHONPATH": str(project_root)}.items()
           if key not in ("COLUMNS", "LINES")}
    header, *lines = on_a_terminal(argv, 80, env, world["repo"].path).splitlines()
    assert header.split()[:5] == ["ID", "STARTED", "ENDED", "KIND", "STATE"]
    assert len(lines) == 2 and all(len(line) <= 80 for line in [header, *lines]), lines
    today = time.strftime("%Y-%m-%d")
    assert all(line.split()[1] == today and re.fullmatch(r"\d\d:\d\d", line.split()[2]) for line in lines), lines
    assert "…" in lines[1] and "finished" in lines[1]

    piped = cli("runs", "--state-dir", str(world["state"]), cwd=world["repo"].path, env={"COLUMNS": ""})
    assert piped.returncode == 0 and shlex.join(long_command) in piped.stdout.splitlines()[2]


@pytest.mark.parametrize("name", ["run", "backport"])
def test_help_lists_the_options_in_sections_and_ends_with_examples_and_exit_codes(name, cli):
    command = importlib.import_module(f"bisector.cli.{name}").__dict__[name]
    shown = cli(name, "--help", env={"COLUMNS": "100"})
    assert shown.returncode == 0, shown.stderr
    titles = [line[:-1] for line in shown.stdout.splitlines() if line and not line[0].isspace() and line[-1] == ":"]
    assert titles == [*command.sections, "Other options", "Examples", "Exit codes"]
    other = shown.stdout.split("\nOther options:\n", 1)[1].split("\n\n", 1)[0]
    assert other.split() == ["-h,", "--help", "Show", "this", "message", "and", "exit."]  # every option placed
    placed = [name for names in command.sections.values() for name in names]
    assert sorted(placed) == sorted({param.name for param in command.params if isinstance(param, click.Option)})
    examples = shown.stdout.split("\nExamples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    known = {opt for param in command.params for opt in param.opts}
    for example in examples:
        words = shlex.split(example)
        assert words[:2] == ["bisector", name]
        given = words[2:words.index("--")] if "--" in words else words[2:]
        assert {word for word in given if word.startswith("--")} <= known, example
    codes = [line.split()[0] for line in shown.stdout.split("\nExit codes:\n", 1)[1].splitlines()
             if line[:4].strip()]
    assert codes == ["0", "1", "2", "3", "4", "5", "130"]
