"""`bisector demo`: the whole job on a throwaway repository."""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import click

from bisector.cli.options import check_writable, python_option
from bisector.cli.progress import ProgressHandler, console
from bisector.errors import (
    EXIT_FOUND,
    EXIT_INCONCLUSIVE,
    UsageError,
)


@click.command("demo")
@click.option("--dir", "directory", type=click.Path(path_type=Path),
              help="Where to create the demo repository, kept (default: a temp dir, removed at the end).")
@click.option("--keep", is_flag=True, help="Keep the default temp dir.")
@click.option("--commits", type=click.IntRange(3, 1000), default=40, show_default=True)
@click.option("--culprit", type=click.IntRange(1, 999), default=25, show_default=True,
              help="Index of the commit that introduces the q_dtype bug.")
@python_option("Python environment the probe runs in (needs torch).")
def demo(directory, commits, culprit, python, keep):
    """Bisect a throwaway vLLM-shaped repo with the CPU probe: the whole job in under a minute."""
    from bisector.engine.config import RunConfig
    from bisector.engine.run import run_bisection
    from bisector.report import renderers as report
    from scenarios import create
    from scenarios.aiter_mla_probe.demo import make_demo_repo

    if culprit >= commits:
        raise UsageError(f"--culprit must be below --commits ({commits})")
    scratch = None
    if directory is None:
        scratch = Path(tempfile.mkdtemp(prefix="bisector-demo-"))
        if not keep:  # removed however the command ends
            click.get_current_context().call_on_close(lambda: shutil.rmtree(scratch, ignore_errors=True))
        directory = scratch / "vllm-demo"
    elif directory.exists():
        raise UsageError(f"{directory} already exists; pick a new --dir")
    else:
        check_writable("--dir", directory)
    good, bad, planted = make_demo_repo(directory, commits, culprit)
    kept = "kept" if keep or scratch is None else "removed at the end; --keep keeps it"
    console.print(f"demo repository: {directory} ({commits} commits, q_dtype bug planted at "
                  f"{planted[:12]}; {kept})")
    console.print(f"running: bisector run --repo {directory} --good {good[:12]} --bad {bad[:12]} "
                  f"--scenario aiter-mla-probe")
    cfg = RunConfig(repo=directory, good=good, bad=bad, scenario=create("aiter-mla-probe"),
                    python=python)
    result = run_bisection(cfg, ProgressHandler())
    click.echo(report.bisect_text(result))
    found = result.culprit is not None and result.culprit.sha == planted
    click.echo("demo: the probe named the planted commit" if found else
               "demo: the probe did NOT name the planted commit")
    sys.exit(EXIT_FOUND if found else EXIT_INCONCLUSIVE)
