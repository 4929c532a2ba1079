"""`bisector shell`: a tool-owned worktree of one commit, built and set up as a step of `run` would be, opened
in the user's shell or running one command there (mozregression's "launch this build")."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bisector.cli.judging import JudgingOptions, RecordOptions, gathered, shared_config
from bisector.cli.options import (
    build_options,
    env_options,
    not_an_option,
    python_option,
    state_dir_option,
    world_options,
)
from bisector.errors import EXIT_INTERRUPTED, EnvironmentFailed

if TYPE_CHECKING:
    from bisector.engine.judge import Judge


@click.command("shell", context_settings={"allow_interspersed_args": False})
@click.option("--ref", required=True, callback=not_an_option, help="Commit to open.")
@click.option("--repo", default=".", callback=not_an_option, show_default=True, help="Repository (never modified).")
@state_dir_option
@python_option("Python environment of the shell (first on PATH), as a step's.")
@build_options
@env_options
@world_options
@click.option("--keep", is_flag=True, help="Keep the worktree when the shell exits (its path is printed).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@gathered(record=RecordOptions, judging=JudgingOptions)
def shell_command(ref, record, judging, keep, command):
    """Open REV built as a step would build it, in $SHELL or running `-- CMD` (exit code: the command's).

    The worktree is the tool's own, in the step's environment (--python first on PATH, the GPU variables,
    the commit's image with --image), removed on exit unless --keep."""
    from bisector.engine.judge import JudgeSpec
    from bisector.engine.state import choose_state_dir, prepare_state_dir
    from bisector.repo.refs import GitRepo
    from bisector.repo.worktrees import OwnWorktree
    from scenarios.command import CommandScenario

    argv = list(command) or [os.environ.get("SHELL") or "/bin/sh"]
    checked = GitRepo(Path(record.repo))
    sha = checked.resolve(ref)  # a bad REV stops here: nothing made yet
    scenario = CommandScenario(argv, in_image=bool(judging.world.image))  # what a step runs a command with
    shared = shared_config(record, judging, scenario, tuple(command))
    directory = prepare_state_dir(choose_state_dir(checked, shared.state_dir))
    judge = JudgeSpec.for_run(shared, scenario).open(checked, directory)
    judge.world.resolve([sha])
    with OwnWorktree(checked, directory / "shells", sha, keep) as tree:  # kept only once the command ran
        code = _run_in(judge, tree, sha, argv, directory / "logs")
        if keep:
            click.echo(f"kept worktree: {tree} (remove it with `git worktree remove --force {tree}`)", err=True)
    sys.exit(code)


def _run_in(judge: Judge, tree: Path, sha: str, argv: list[str], logs: Path) -> int:
    """Set tree up as the judge's steps are (its environment, world and build) and run argv in it; its exit code
    (128 + N when killed by signal N)."""
    from bisector.builds.base import BuildResult
    from bisector.machine.envs import worktree_reader
    from bisector.machine.gpus import gpu_env, visible_gpus
    from bisector.world.place import StepAt

    logs = logs / f"shell-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    gpus = visible_gpus()
    slot_env = gpu_env(gpus) if gpus else {}
    python = judge.spec.python
    with judge.envs.environment(worktree_reader(tree)) as environment:
        if not environment.ok:
            raise EnvironmentFailed(f"{sha[:12]}: the commit's environment could not be created: {environment.reason}")
        with judge.world.enter(StepAt(sha, tree, logs, slot_env), environment, python) as place:
            if not place.ok:
                raise EnvironmentFailed(f"{sha[:12]}: {place.reason}")
            stands_on = place.environment or environment
            built = judge.builder.prepare(tree, sha, logs, stands_on) if place.build else \
                BuildResult("image", True, place.summary)
            if not built.ok:
                raise EnvironmentFailed(f"{sha[:12]}: build failed: {built.reason}"
                                        + (f" (log: {built.log_path})" if built.log_path else "")
                                        + "; --build none opens the commit unbuilt")
            step_env = {**(place.slot_env if place.slot_env is not None else slot_env), **stands_on.env, **built.env}
            click.echo(f"bisector: {sha[:12]} in {tree} ({built.summary or built.strategy})", err=True)
            if place.container is not None:  # the checkout at its own path inside the commit's image
                command = place.container.command(argv, tree, step_env)
                if sys.stdin.isatty():
                    command[2:2] = ["--interactive", "--tty"]
                return _wait(command, tree, None)
            interpreter = Path(shutil.which(place.python or stands_on.python or python) or python)
            path = os.pathsep.join([str(interpreter.parent), step_env.get("PATH", os.environ.get("PATH", ""))])
            return _wait(argv, tree, {**os.environ, **step_env, "PATH": path})


def _wait(argv: list[str], cwd: Path, env: dict | None) -> int:
    """argv's exit code. It runs in a process group of its own, given the terminal when this process has it;
    Ctrl-C belongs to it (an interactive shell keeps it); SIGTERM and SIGHUP (bisector.cli turns them into
    KeyboardInterrupt) end its whole group, as does its end: nothing it started outlives the worktree."""
    terminal = _own_terminal()
    child = subprocess.Popen(argv, cwd=cwd, env=env, preexec_fn=lambda: _lead_group(terminal))
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _signal_group(child.pid, signal.SIGINT))
    try:
        code = child.wait()
    except KeyboardInterrupt:
        _end_group(child)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, previous)
        _signal_group(child.pid, signal.SIGKILL)  # what the command left running
        if terminal is not None:
            _take_terminal(terminal)
    return 128 - code if code < 0 else code


GRACE_SECONDS = 5.0  # a command's group has this long to end on SIGTERM before it is killed


def _end_group(child: subprocess.Popen) -> None:
    """SIGTERM to child's process group, then SIGKILL to what is left of it."""
    _signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(child.pid, signal.SIGKILL)
    child.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _lead_group(terminal: int | None) -> None:
    """In the command's process before it starts: a process group of its own, in the terminal's foreground when
    the shell had it (Popen's process_group is Python 3.11's)."""
    os.setpgid(0, 0)
    if terminal is not None:
        _take_terminal(terminal)


def _own_terminal() -> int | None:
    """stdin's terminal when this process's group is in its foreground (an interactive shell), else None."""
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


def _take_terminal(fd: int) -> None:
    """Make the calling process's group the foreground of terminal fd (SIGTTOU, sent to a background group
    that does this, ignored meanwhile)."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, previous if previous is not None else signal.SIG_DFL)
