"""Command line: parse options, call one function, render the result.

Each command imports the engine, git, the scenarios and the reports when it runs, so that `bisector --help`
(and a usage error) costs little more than importing click: see bench/cli_startup.py.
"""
from __future__ import annotations

import signal
import sys

import click

from bisector import __version__
from bisector.cli.backport import backport
from bisector.cli.cache import cache
from bisector.cli.demo import demo
from bisector.cli.doctor import doctor_command
from bisector.cli.env import env_group
from bisector.cli.report import report_command, runs_command
from bisector.cli.run import run
from bisector.cli.scenario import scenario
from bisector.errors import EXIT_INTERRUPTED, BisectorError
from bisector.process import forget_caller_git
from bisector.redact import redact


class BisectorGroup(click.Group):
    """Turns every BisectorError and click usage error into its one line and exit code, and an
    interrupt into 130."""

    def main(self, args=None, prog_name=None, **extra):
        forget_caller_git()
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.ClickException as exc:
            message = " ".join(exc.format_message().split())
            click.echo(f"bisector: error: {redact(message)}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("bisector: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BisectorError as exc:
            click.echo(f"bisector: error: {redact(exc.message())}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("bisector: interrupted; verdicts so far are kept, run the same command to resume",
                       err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=BisectorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisector")
def main() -> None:
    """Find the vLLM commit behind a ROCm GPU fault, and prove its fix backports."""
    signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum, frame):
    raise KeyboardInterrupt


for command in (backport, cache, demo, doctor_command, env_group, report_command, run, runs_command, scenario):
    main.add_command(command)
