"""One way from options to a judge (pip's RequirementCommand): click passes one parameter per option, `gathered`
hands a command each option group as one typed value, and `shared_config` turns the groups every judging command
shares into the SharedConfig its JudgeSpec is built from (JudgeSpec.for_run)."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from bisector.builds import DEFAULT_CACHE_SIZE, BuildSettings
from bisector.cli.options import command_line, parse_log_limit
from bisector.machine.envs import DEFAULT_ENV_CACHE_SIZE, EnvSettings

if TYPE_CHECKING:
    from bisector.engine.settings import SharedConfig
    from bisector.seams import Scenario
    from bisector.world.world import WorldOptions

Command = TypeVar("Command", bound=Callable[..., Any])


def gathered(**groups: type) -> Callable[[Command], Command]:
    """The command receives, for each name=Group (a dataclass), one Group of the parameters its fields name; a
    field the command has no option for keeps the Group's default. Put it next to the function, under the
    options, so that every option's parameter has arrived."""
    def gather(command: Command) -> Command:
        @functools.wraps(command)
        def with_groups(*args, **kwargs):
            for name, group in groups.items():
                kwargs[name] = group(**{field.name: kwargs.pop(field.name) for field in dataclasses.fields(group)
                                        if field.name in kwargs})
            return command(*args, **kwargs)
        return with_groups  # type: ignore[return-value]
    return gather


@dataclass(frozen=True)
class RecordOptions:
    """Where the record is and what it serves: --repo, --state-dir, --log-limit, --no-cache, --reuse-verdicts."""

    repo: str = "."
    state_dir: Path | None = None
    log_limit: str = "20M"
    no_cache: bool = False
    reuse_verdicts: bool = False


@dataclass(frozen=True)
class JudgingOptions:
    """How each commit is judged: --python, the build options (bisector.cli.options.build_options), --env,
    --env-cache-size, --timeout, --repeat and the world options (world_options' value)."""

    python: str
    world: WorldOptions
    build: str | None = None
    rocm_arch: str | None = None
    wheels: str | None = None
    allow_install_into_python: bool = False
    cache_size: str = DEFAULT_CACHE_SIZE
    env_mode: str = "shared"
    env_cache_size: int = DEFAULT_ENV_CACHE_SIZE
    timeout: float | None = None
    repeat: int = 1

    def build_settings(self, command: tuple[str, ...]) -> BuildSettings:
        """The build options checked (BuildSettings.from_options: without --build a -- CMD builds nothing)."""
        return BuildSettings.from_options(self.build, self.python, self.rocm_arch, self.wheels, self.cache_size,
                                          command).allowing_install(self.allow_install_into_python)


def shared_config(record: RecordOptions, judging: JudgingOptions, scenario: Scenario | None,
                  command: tuple[str, ...], executor_kind: str = "local", follow_pins: bool = False) -> SharedConfig:
    """The settings the options of run, backport, scenario run|calibrate and shell share, checked (UsageError in
    one line): the record, the build for command (a -- CMD builds nothing unless --build says), --python held
    once, the environments, the world scenario stands on (on executor_kind's machines, with follow_pins)."""
    from bisector.engine.settings import SharedConfig
    from bisector.world.world import WorldSettings

    builder = judging.build_settings(command)
    world = WorldSettings.from_options(judging.world, scenario, judging.env_mode, judging.rocm_arch, executor_kind,
                                       follow_pins)
    return SharedConfig(repo=Path(record.repo), state_dir=record.state_dir, log_limit=parse_log_limit(record.log_limit),
                        no_cache=record.no_cache, reuse_verdicts=record.reuse_verdicts, command_line=command_line(),
                        python=judging.python, builder=builder, timeout=judging.timeout, repeat=judging.repeat,
                        envs=EnvSettings(judging.env_mode, judging.python, judging.env_cache_size), world=world,
                        follow_pins=follow_pins)


def fields_of(shared: SharedConfig) -> dict[str, Any]:
    """shared's fields by name, for the command's own config (RunConfig, BackportConfig) that extends it."""
    return {field.name: getattr(shared, field.name) for field in dataclasses.fields(shared)}
