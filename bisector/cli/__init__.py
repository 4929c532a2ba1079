"""Command line: the `bisector` group, and the map from each command's name to the module that holds it.

A command's module is imported only when that command runs or its own --help is asked, so `bisector --help`
(and a usage error) costs little more than importing click: see bench/cli_startup.py.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any, NoReturn, Sequence

import click

from bisector import __version__
from bisector.errors import EXIT_INTERRUPTED, BisectorError

# name -> (the module holding it, the click command's name there, the first paragraph of its help: what
# `bisector --help` shows without importing the module; tests/test_cli_startup.py holds it to the command's own)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "backport": ("bisector.cli.backport", "backport",
                 "Check a fix on every branch matching --branches; verify with --scenario NAME or -- CMD."),
    "cache": ("bisector.cli.cache", "cache",
              "The verdict cache: list what is stored, forget verdicts so they are judged again."),
    "demo": ("bisector.cli.demo", "demo",
             "Bisect a throwaway vLLM-shaped repo with the CPU probe: the whole job in under a minute."),
    "doctor": ("bisector.cli.doctor", "doctor_command",
               "Versions, GPUs, the container runtime and disk use, for support requests (changes nothing)."),
    "env": ("bisector.cli.env", "env_group",
            "Per-commit environments (--env per-commit): create one, list them, remove them."),
    "mark": ("bisector.cli.mark", "mark_command",
             "Give REV a verdict by hand in run RUN (good, bad or skip); resumed, the run uses it untested."),
    "report": ("bisector.cli.report", "report_command",
               "Regenerate a run's report from the stored record (bisection or backport)."),
    "run": ("bisector.cli.run", "run",
            "Bisect good..bad with a named scenario or `-- CMD [ARGS...]` (git bisect run protocol)."),
    "runs": ("bisector.cli.report", "runs_command", "Recorded runs: id, repository, range, command, state, answer."),
    "shell": ("bisector.cli.shell", "shell_command",
              "Open REV built as a step would build it, in $SHELL or running `-- CMD` (exit code: the command's)."),
    "scenario": ("bisector.cli.scenario", "scenario", "List scenarios, or run one on a single commit."),
}


class BisectorGroup(click.Group):
    """The commands of COMMANDS, each imported when asked for; turns every BisectorError and click usage error
    into its one line and exit code, and an interrupt into 130."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> NoReturn:
        """Run the command given in args and exit; always standalone, in the group's own way (standalone_mode is
        taken for click's signature only)."""
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            from bisector.redact import redact

            message = " ".join(exc.format_message().split()) + _configured(exc)
            click.echo(f"bisector: error: {redact(message)}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("bisector: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module), attribute)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """The command asked for, its configuration loaded (bisector.cli.config) as the defaults of its options."""
        try:
            name, command, rest = super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:  # "did you mean" from the map (no command is loaded)
            raise click.exceptions.NoSuchCommand(exc.command_name, possibilities=COMMANDS, ctx=ctx) from None
        if name is not None and command is not None and not ctx.resilient_parsing:
            from bisector.cli.options import configure

            configure(ctx, name, command, rest)
        return name, command, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one-line help, as click writes them, from COMMANDS alone."""
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        with formatter.section("Commands"):
            formatter.write_dl([(name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit))
                                for name in self.list_commands(ctx)])

    def invoke(self, ctx: click.Context):
        from bisector.process import forget_caller_git
        from bisector.redact import redact

        forget_caller_git()  # before a command is resolved, its options parsed or anything run
        try:
            return super().invoke(ctx)
        except BisectorError as exc:
            click.echo(f"bisector: error: {redact(exc.message())}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            from bisector.cli.progress import resume_hint

            hint = resume_hint(ctx.meta.get("no_cache", False))
            click.echo(f"bisector: interrupted; verdicts so far are kept, {hint}", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=BisectorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisector")
def main() -> None:
    """Find the vLLM commit behind a ROCm GPU fault, and prove its fix backports."""
    signal.signal(signal.SIGTERM, _stop)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # under nohup it stays ignored
        signal.signal(signal.SIGHUP, _stop)  # a closed terminal or a dropped ssh: as SIGTERM
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # ignored (a background job): it stays so
        signal.signal(signal.SIGINT, _stop)


def _configured(exc: click.ClickException) -> str:
    """Where a refused value came from, when configuration gave it (bisector.cli.config), else ""."""
    if not isinstance(exc, click.BadParameter) or exc.ctx is None or exc.param is None or exc.param.name is None:
        return ""
    from click.core import ParameterSource

    from bisector.cli.options import CONFIG

    config = exc.ctx.find_root().meta.get(CONFIG)
    if config is None or exc.ctx.get_parameter_source(exc.param.name) is not ParameterSource.DEFAULT_MAP:
        return ""
    return f" (configured: {config.source_of(exc.param.name)})"


_stopping = False  # the first Ctrl-C or SIGTERM has been heard: the command is unwinding


def _stop(signum, frame):
    """Ctrl-C, SIGTERM or SIGHUP: say at once on stderr what stopping waits for, then stop (KeyboardInterrupt). A second
    one while the command unwinds is told the same and lets the unwinding finish: breaking it off would leave
    steps running, the run's row unsaved or the tool's worktrees registered in the user's repository."""
    global _stopping
    os.write(2, (stopping_line(signal.Signals(signum).name, again=_stopping) + "\n").encode())
    if not _stopping:
        _stopping = True
        raise KeyboardInterrupt


def stopping_line(signame: str, again: bool = False) -> str:
    """What a stop waits for, in one line: the running steps' processes, the record and the worktrees of a run
    that is on (bisector.process.GROUPS records them), else nothing."""
    process = sys.modules.get("bisector.process")
    groups = process.GROUPS if process is not None else None
    said = f"bisector: {'still stopping' if again else 'stopping'} ({'Ctrl-C' if signame == 'SIGINT' else signame})"
    if groups is None or groups.directory is None:
        return said
    running = len(groups.groups)
    ending = f"ending {running} running step{'' if running == 1 else 's'}, then " if running else ""
    return f"{said}: {ending}saving the verdicts so far in the record and removing the run's worktrees …"
