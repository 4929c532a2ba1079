"""The options commands share, and the checks that turn them into settings (one UsageError line each)."""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from bisector.builds import DEFAULT_CACHE_SIZE, STRATEGIES, parse_size
from bisector.builds import REGISTRY as BUILD_STRATEGIES
from bisector.engine.executor import checked_git_source
from bisector.errors import (
    GitError,
    UsageError,
)
from bisector.machine.envs import DEFAULT_ENV_CACHE_SIZE, MODES
from bisector.redact import redact_all
from bisector.registry import Registry
from bisector.repo.pins import unsafe_git_source

if TYPE_CHECKING:
    from bisector.world.world import WorldOptions


class RegistryChoice(click.Choice):
    """The names of a registry's entries (and fixed names around them); an alias is taken as its entry."""

    def __init__(self, registry: Registry, names: tuple[str, ...] | list[str]):
        self.registry = registry
        super().__init__(list(names))

    def convert(self, value, param, ctx):
        return super().convert(self.registry.canonical(value) if isinstance(value, str) else value, param, ctx)


def registry_options(registry: Registry):
    """The command-line options every entry of registry declares (bisector.registry.Option)."""
    def add(command):
        for option in reversed(registry.options()):
            command = click.option(*option.decls, **option.settings)(command)
        return command
    return add


# The most each kind of number may be. Every numeric option is a click range with a maximum (--help shows
# it; tests/hostile/test_hostile_options.py holds every command to it): past these a value is a typo, not a
# plan, and 99999999999999999999 would overflow or allocate without end downstream.
MOST_SECONDS = 7 * 24 * 3600  # --timeout: a week per step
MOST_AT_ONCE = 1024           # --jobs, --gpus-per-run: steps or GPUs at once
MOST_RUNS = 10_000            # --repeat, --max-runs-per-commit, --max-samples, --warmup, --runs: runs of a commit
MOST_KEPT = 10_000            # --env-cache-size, --aiter-cache-size: entries a cache keeps
MOST_PERCENT = 1_000_000.0    # --min-change


class FiniteFloat(click.FloatRange):
    """A finite float in range: nan and inf are refused (nan would disable every comparison)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def not_an_option(ctx, param, value):
    """Refuse a value that is an option name (`--good --bad X` left --good without its value)."""
    for given in value if isinstance(value, tuple) else (value,):
        if isinstance(given, str) and given.startswith("-"):
            raise click.BadParameter(f"got the option {given!r} where a value belongs; "
                                     f"give {param.opts[0]} a value")
    return value


def absolute_path(ctx, param, value):
    """Resolve a path option once, against the cwd (git and Python then see the same place)."""
    return Path(os.path.abspath(value)) if value is not None else None


NAME_MAX = 255  # bytes of one name in a path, the most Linux file systems take
PATH_MAX = 4096  # bytes of a path the kernel takes, its closing NUL included


def _null_device(found: os.stat_result) -> bool:
    """Whether found (a path's stat) is the null device (`--json /dev/null`: the output thrown away, as asked)."""
    return stat.S_ISCHR(found.st_mode) and found.st_rdev == os.stat(os.devnull).st_rdev


def _no_file(option: str, path: Path, mode: int) -> UsageError:
    """The one line refusing a path that is no regular file (a FIFO, a device, a socket)."""
    return UsageError(f"{option} {path}: {'a FIFO' if stat.S_ISFIFO(mode) else 'not a regular file'}; give a file")


def check_writable(option: str, path: Path | None) -> None:
    """Raise UsageError unless path can be written (checked before any step runs): a regular file or none yet,
    not a FIFO, device (but the null device) or socket (a write there hangs or fails at the end), nor a symlink
    to nothing, its names within the file system's lengths; missing parent folders are made when written."""
    if path is None:
        return
    if len(os.fsencode(path.absolute())) >= PATH_MAX:
        raise UsageError(f"{option} {path}: longer than {PATH_MAX - 1} bytes, the most a path may be")
    if any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        raise UsageError(f"{option} {path}: a name in it is longer than {NAME_MAX} bytes, the most a file "
                         "system takes")
    try:
        found: os.stat_result | None = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        found = None
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}") from None
    if found is None and path.is_symlink():
        raise UsageError(f"{option} {path}: a symlink to {os.readlink(path)}, which does not exist; give a file")
    if found is not None:
        if stat.S_ISDIR(found.st_mode):
            raise UsageError(f"{option} {path}: is a directory")
        if not stat.S_ISREG(found.st_mode) and not _null_device(found):
            raise _no_file(option, path, found.st_mode)
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {path}: not writable")
        return
    base = next(parent for parent in path.absolute().parents if os.path.lexists(parent))
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot create a file there ({base} is "
                         f"{'not writable' if base.is_dir() else 'not a directory'})")


def write_output(option: str, path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}") from None


def parse_log_limit(text: str) -> int:
    try:
        limit = parse_size(text)
    except ValueError as exc:
        raise UsageError(f"--log-limit: {exc}") from None
    if limit < 1024:
        raise UsageError(f"--log-limit {text}: keep at least 1k of each log")
    return limit


log_limit_option = click.option("--log-limit", default="20M", show_default=True, metavar="SIZE",
                                 help="Bytes kept of each step's log: the first and last halves, the cut marked.")


def read_bounded(option: str, path: Path, most: int, errors: str = "strict") -> str:
    """The text of the regular file path (an option's), refused in one line (UsageError) when it is a FIFO,
    a device (/dev/zero), a directory or larger than most bytes, rather than read without end."""
    try:  # a FIFO opens without waiting for a writer; a directory is refused by open itself
        file = open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK))
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}") from None
    with file:
        mode = os.fstat(file.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _no_file(option, path, mode)
        data = file.read(most + 1)
    if len(data) > most:
        raise UsageError(f"{option} {path}: larger than {most // 1024**2}M, more than this option reads")
    try:
        return data.decode(errors=errors)
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option} {path}: {exc}") from None


def split_values(value: str) -> list[str]:
    """An --option value as a comma list: `gfx942,gfx950` is two values; `\\,` is a comma inside one."""
    values, current, chars = [], "", iter(value)
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            current += following if following == "," else char + following
        elif char == ",":
            values.append(current)
            current = ""
        else:
            current += char
    return [*values, current]


def option_values(pairs: tuple[str, ...]) -> list[tuple[str, dict[str, str]]]:
    """Every combination of the values of comma-listed --option KEY=A,B (see split_values), in order, as
    (label, options): the label names the listed keys' values ("arch=gfx950"); one ("", options) when no
    value is a list."""
    listed: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option takes KEY=VALUE, got {pair!r}")
        listed[key] = split_values(value)
    combinations: list[tuple[str, dict[str, str]]] = [("", {})]
    for key, values in listed.items():
        if len(set(values)) != len(values):
            raise UsageError(f"--option {key}={','.join(values)}: a value is listed twice")
        combinations = [(" ".join(filter(None, [label, f"{key}={value}" if len(values) > 1 else ""])),
                         {**options, key: value}) for label, options in combinations for value in values]
    return combinations


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    """--option KEY=VALUE pairs for one scenario: a comma list (several values) is refused in one line."""
    combinations = option_values(pairs)
    if len(combinations) > 1:
        raise UsageError(f"--option: {len(combinations)} values given ({', '.join(label for label, _ in combinations)})"
                         "; only `bisector run` (a run per value) and `bisector backport` (a column per value) take "
                         "a comma list, or write \\, for a comma inside a value")
    return combinations[0][1]


def state_dir_path(ctx, param, value: str | None) -> Path | None:
    """--state-dir made absolute once; an empty one (an unset variable, `--state-dir "$STATE"`) refused
    rather than taken as the cwd."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty (an unset variable?); give a directory, or leave the option out "
                                 "for the default <git dir>/bisector")
    return absolute_path(ctx, param, value)


state_dir_option = click.option("--state-dir", type=click.Path(), callback=state_dir_path,
                                help="Default: the configured state_dir ($BISECTOR_STATE_DIR, pyproject.toml, "
                                     "config.toml), else <git dir>/bisector.")

pr_url_template_option = click.option(
    "--pr-url-template", metavar="URL",
    help="Link PR numbers in Markdown: a URL with {pr} (default: origin's pull URL when it is GitHub).")


def pr_links(repo: str, template: str | None) -> str | None:
    """--pr-url-template as given (it must hold {pr}), else origin's GitHub pull URL, else None."""
    if template is not None:
        if "{pr}" not in template:
            raise UsageError(f"--pr-url-template needs {{pr}} where the PR number goes, got {template!r}")
        return template
    from bisector.repo.refs import GitRepo
    from bisector.report.renderers import github_pull_url_template
    try:
        return github_pull_url_template(GitRepo(Path(repo)).origin_url())
    except GitError:
        return None


def python_option(purpose: str):
    """--python: the interpreter (environment) scenarios run in, default this one."""
    return click.option("--python", "python", default=sys.executable, show_default="this interpreter",
                        help=purpose)


def build_options(command):
    """The build options `run` and `backport` share (see BuildSettings.from_options): --build, every registered
    strategy's own options, --cache-size."""
    options = [
        click.option("--build", "build", type=RegistryChoice(BUILD_STRATEGIES, STRATEGIES), default=None,
                     help="How each commit is built: cheapest valid for a vLLM tree (auto), or one strategy "
                          "(`python` is the old name of reuse). "
                          "Default: auto for a named scenario, none for -- CMD (it builds for itself)."),
        registry_options(BUILD_STRATEGIES),
        click.option("--cache-size", default=DEFAULT_CACHE_SIZE, show_default=True,
                     help="Cap on stored compiled artifacts (least recently used evicted)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def env_options(command):
    """--env and --env-cache-size (`run`, `backport`, `scenario run`)."""
    options = [
        click.option("--env", "env_mode", type=click.Choice(MODES), default="shared", show_default=True,
                     help="Run every commit in --python (shared), or in an environment built from that "
                          "commit's own requirements over --python (per-commit)."),
        click.option("--env-cache-size", type=click.IntRange(1, MOST_KEPT), default=DEFAULT_ENV_CACHE_SIZE,
                     show_default=True, help="Per-commit environments kept (least recently used removed)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


WORLD_PARAMETERS = ("image", "image_fallback", "container_runtime", "container_network", "image_cache_size",
                    "aiter", "aiter_cache_size", "aiter_prebuild", "aiter_repo")


def world_options(command):
    """--image and its options, --aiter and its options (`run`, `backport`, `scenario run|calibrate`); the
    command receives them as one `world` value (bisector.world.world.WorldOptions), with the names of those
    that came from configuration (defaults: applied, never refused for being there)."""
    from bisector.world.aiter import DEFAULT_AITER_CACHE_SIZE
    from bisector.world.images import DEFAULT_IMAGE_CACHE_SIZE, FALLBACKS, RUNTIMES
    from bisector.world.world import AITER_MODES, WorldOptions

    options = [
        click.option("--image", metavar="TEMPLATE",
                     help="Run each commit in its own container image, e.g. 'rocm/vllm-ci:{commit}' ({commit}: the "
                          "full sha, {short}: 12 hex); a commit without one is skipped. Default: the configured "
                          "image."),
        click.option("--image-fallback", type=click.Choice(FALLBACKS), default=None,
                     help="--image: a commit without an image is skipped (skip, the default) or built here (build)."),
        click.option("--container-runtime", type=click.Choice(RUNTIMES), default=None,
                     help="--image: the container runtime (default: docker)."),
        click.option("--container-network", metavar="NETWORK", default=None,
                     help="--image: the containers' network (default: none)."),
        click.option("--image-cache-size", metavar="SIZE", default=None,
                     help=f"--image: images this tool pulled kept at most (least recently used removed; images it "
                          f"did not pull are never removed). Default: {DEFAULT_IMAGE_CACHE_SIZE}."),
        click.option("--aiter", type=click.Choice(AITER_MODES), default=None,
                     help="Bare metal: install each commit's pinned AITER (pinned), require the environment's to be "
                          "the pin (installed: the default for scenarios that depend on AITER), or take any."),
        click.option("--aiter-cache-size", type=click.IntRange(1, MOST_KEPT), default=None,
                     help=f"--aiter pinned: AITER builds and layers kept (default {DEFAULT_AITER_CACHE_SIZE})."),
        click.option("--aiter-prebuild", is_flag=True, default=None,
                     help="--aiter pinned: prebuild AITER's kernels as vLLM's images do (default: JIT mode)."),
        click.option("--aiter-repo", metavar="PATH|URL", default=None, callback=checked_git_source,
                     help="Another spelling of --option aiter_repo=PATH|URL (AITER's repository instead of the "
                          "pin's, for --aiter pinned and the scenarios that clone AITER); configured as aiter_repo."),
    ]

    @functools.wraps(command)
    def with_world(*args, **kwargs):
        ctx = click.get_current_context()
        world = WorldOptions(**{name: kwargs.pop(name) for name in WORLD_PARAMETERS},
                             configured=frozenset(name for name in WORLD_PARAMETERS
                                                  if ctx.get_parameter_source(name) is ParameterSource.DEFAULT_MAP))
        if "options" in kwargs:
            scenario_name = kwargs.get("scenario_name", kwargs.get("name"))
            kwargs["options"], world = one_aiter_repo(kwargs["options"], scenario_name, world)
        kwargs["world"] = world
        return command(*args, **kwargs)

    for option in reversed(options):
        with_world = option(with_world)
    return with_world


def one_aiter_repo(pairs: tuple[str, ...], scenario_name: str | None,
                   world: WorldOptions) -> tuple[tuple[str, ...], WorldOptions]:
    """AITER's repository has one name, aiter_repo: `--option aiter_repo=X` (the spelling documented),
    `--aiter-repo X` (an alias fed the same value) or the configured aiter_repo. Returns the --option pairs
    and the world options with that one value in both places that read it: the scenario's own option (when
    the scenario takes one) and the repository --aiter pinned clones."""
    given = [value for key, _, value in (pair.partition("=") for pair in pairs) if key == "aiter_repo"]
    alias = None if "aiter_repo" in world.configured else world.aiter_repo
    if given and alias is not None and given[-1] != alias:
        raise UsageError(f"--aiter-repo {alias} and --option aiter_repo={given[-1]} name AITER's one repository "
                         "twice: give it once, as --option aiter_repo=PATH|URL")
    takes = scenario_takes(scenario_name, "aiter_repo")
    if given:
        problem = unsafe_git_source(given[-1])
        if problem and not takes:
            raise UsageError(f"--option aiter_repo={given[-1]!r}: {problem}")
        world = dataclasses.replace(world, aiter_repo=given[-1], configured=world.configured - {"aiter_repo"})
        if not takes and world.aiter == "pinned":
            pairs = tuple(pair for pair in pairs if pair.partition("=")[0] != "aiter_repo")
    elif world.aiter_repo is not None and takes:
        pairs = (*pairs, f"aiter_repo={world.aiter_repo}")
    return pairs, world


def scenario_takes(name: str | None, option: str) -> bool:
    """Whether the scenario called name declares option (False for -- CMD, or a name no scenario has)."""
    if name is None:
        return False
    from scenarios import available

    found = available().get(name)
    return found is not None and option in getattr(found, "option_defaults", {})


def configure(ctx: click.Context, name: str, command: click.Command, args: list[str]) -> None:
    """Load the configuration (bisector.cli.config) seen from the command's --repo, else the cwd: the defaults of
    every option it names, for the command and its subcommands (click's default_map: an option given on the
    command line wins), and ctx.meta[CONFIG] (what `doctor` shows)."""
    from bisector.cli.config import load

    config = load(repository_argument(ctx, name, command, args) or ".")
    ctx.meta[CONFIG] = config
    ctx.default_map = {name: _defaults_under(command, config.defaults())}


CONFIG = "bisector.cli.config"  # ctx.meta key of the loaded configuration


def repository_argument(ctx: click.Context, name: str, command: click.Command, args: list[str]) -> str | None:
    """The --repo the command line gives the command (or its subcommand), read by click's own parser before
    the options are processed (their defaults depend on it); None when not given. A mistake in args is left
    for the real parse to report."""
    while True:
        parsing = click.Context(command, parent=ctx, info_name=name, resilient_parsing=True)
        values, rest, _ = command.make_parser(parsing).parse_args(list(args))
        if not isinstance(command, click.Group) or not rest:
            repo = values.get("repo")
            return repo if isinstance(repo, str) else None
        sub = command.get_command(parsing, rest[0])
        if sub is None:
            return None
        ctx, name, command, args = parsing, rest[0], sub, rest[1:]


def _defaults_under(command: click.Command, values: dict[str, str]) -> dict:
    """click's default_map for command: values, and the same under each of its subcommands."""
    nested: dict = dict(values)
    if isinstance(command, click.Group):
        nested.update({name: _defaults_under(sub, values) for name, sub in command.commands.items()})
    return nested


reuse_verdicts_option = click.option(
    "--reuse-verdicts", is_flag=True,
    help="Serve `-- CMD` verdicts of earlier runs too (keyed on the environment, volatile variables aside); "
         "by default a command's verdicts serve only its own run and that run's resumptions.")


def command_line() -> list[str]:
    """How this bisector was invoked, as an argument list (stored with the run, shown in reports), its
    credentials redacted (bisector.redact)."""
    return ["bisector", *redact_all(sys.argv[1:])]
