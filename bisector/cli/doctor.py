"""`bisector doctor`: versions, GPUs, the runtime and disk use."""
from __future__ import annotations

import click
from click.core import ParameterSource

from bisector.cli.options import CONFIG, not_an_option, python_option, state_dir_option
from bisector.cli.state import resolve_state_dir


@click.command("doctor")
@click.option("--repo", default=".", callback=not_an_option, show_default=True,
              help="Repository whose state dir to size.")
@state_dir_option
@python_option("Python environment scenarios run in.")
@click.option("--container-runtime", type=click.Choice(("docker", "podman")), default="docker", show_default=True,
              help="The container runtime --image would use.")
def doctor_command(repo, state_dir, python, container_runtime):
    """Versions, GPUs, the container runtime and disk use, for support requests (changes nothing).

    Then the configuration in effect (bisector.cli.config): each key's value and where it came from."""
    from bisector.machine import doctor

    ctx = click.get_current_context()
    given = {"state_dir": str(state_dir)} if ctx.get_parameter_source("state_dir") is ParameterSource.COMMANDLINE \
        else {}
    click.echo(doctor.report(python, resolve_state_dir(repo, state_dir), container_runtime,
                             ctx.find_root().meta[CONFIG].lines(given)))
