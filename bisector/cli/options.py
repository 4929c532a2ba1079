"""The options commands share, and the checks that turn them into settings (one UsageError line each)."""
from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bisector.builds import DEFAULT_CACHE_SIZE, STRATEGIES, BuildSettings, parse_size
from bisector.builds import REGISTRY as BUILD_STRATEGIES
from bisector.envs import DEFAULT_ENV_CACHE_SIZE, MODES
from bisector.errors import (
    GitError,
    UsageError,
)
from bisector.executor import checked_git_source
from bisector.redact import redact_all
from bisector.registry import Registry

if TYPE_CHECKING:
    from bisector.seams import Scenario
    from bisector.world import WorldSettings


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


def check_writable(option: str, path: Path | None) -> None:
    """Raise UsageError unless path can be written (checked before any step runs); missing parent
    folders are made when it is written."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {path}: not writable")
        return
    base = next(parent for parent in path.absolute().parents if parent.exists())
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


state_dir_option = click.option("--state-dir", type=click.Path(), envvar="BISECTOR_STATE_DIR",
                                callback=state_dir_path,
                                help="Default: $BISECTOR_STATE_DIR, else <git dir>/bisector.")

pr_url_template_option = click.option(
    "--pr-url-template", metavar="URL",
    help="Link PR numbers in Markdown: a URL with {pr} (default: origin's pull URL when it is GitHub).")


def pr_links(repo: str, template: str | None) -> str | None:
    """--pr-url-template as given (it must hold {pr}), else origin's GitHub pull URL, else None."""
    if template is not None:
        if "{pr}" not in template:
            raise UsageError(f"--pr-url-template needs {{pr}} where the PR number goes, got {template!r}")
        return template
    from bisector.refs import GitRepo
    from bisector.report import github_pull_url_template
    try:
        return github_pull_url_template(GitRepo(Path(repo)).origin_url())
    except GitError:
        return None


def python_option(purpose: str):
    """--python: the interpreter (environment) scenarios run in, default this one."""
    return click.option("--python", "python", default=sys.executable, show_default="this interpreter",
                        help=purpose)


def build_options(command):
    """The build options `run` and `backport` share (see build_settings): --build, every registered
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
        click.option("--env-cache-size", type=click.IntRange(min=1), default=DEFAULT_ENV_CACHE_SIZE,
                     show_default=True, help="Per-commit environments kept (least recently used removed)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


WORLD_PARAMETERS = ("image", "image_fallback", "container_runtime", "container_network", "image_cache_size",
                    "aiter", "aiter_cache_size", "aiter_prebuild", "aiter_repo")


def world_options(command):
    """--image and its options, --aiter and its options (`run`, `backport`, `scenario run|calibrate`); the
    command receives them as one `world` mapping (see world_settings)."""
    from bisector.aiter import DEFAULT_AITER_CACHE_SIZE
    from bisector.images import DEFAULT_IMAGE_CACHE_SIZE, FALLBACKS, RUNTIMES
    from bisector.world import AITER_MODES

    options = [
        click.option("--image", metavar="TEMPLATE",
                     help="Run each commit in its own container image, e.g. 'rocm/vllm-ci:{commit}' ({commit}: the "
                          "full sha, {short}: 12 hex); a commit without one is skipped."),
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
        click.option("--aiter-cache-size", type=click.IntRange(min=1), default=None,
                     help=f"--aiter pinned: AITER builds and layers kept (default {DEFAULT_AITER_CACHE_SIZE})."),
        click.option("--aiter-prebuild", is_flag=True, default=None,
                     help="--aiter pinned: prebuild AITER's kernels as vLLM's images do (default: JIT mode)."),
        click.option("--aiter-repo", metavar="PATH|URL", default=None, callback=checked_git_source,
                     help="--aiter pinned: clone AITER from here instead of the pin's repository."),
    ]

    @functools.wraps(command)
    def with_world(*args, **kwargs):
        kwargs["world"] = {name: kwargs.pop(name) for name in WORLD_PARAMETERS}
        return command(*args, **kwargs)

    for option in reversed(options):
        with_world = option(with_world)
    return with_world


def world_settings(world: dict, scenario: Scenario | None, env_mode: str, rocm_arch: str | None = None,
                   executor: str = "local") -> WorldSettings:
    """The world options as bisector.world.WorldSettings, checked against the scenario (None: `backport`
    without one) and the other options (UsageError in one line)."""
    from bisector.aiter import DEFAULT_AITER_CACHE_SIZE, AiterSettings
    from bisector.images import DEFAULT_IMAGE_CACHE_SIZE, DEFAULT_NETWORK, ImageSettings, check_template
    from bisector.world import WorldSettings

    image_only = ("image_fallback", "container_runtime", "container_network", "image_cache_size")
    pinned_only = ("aiter_cache_size", "aiter_prebuild", "aiter_repo")
    given = [name for name in image_only if world[name] is not None]
    if given and not world["image"]:
        raise UsageError(f"--{given[0].replace('_', '-')} needs --image")
    given = [name for name in pinned_only if world[name] is not None]
    if given and world["aiter"] != "pinned":
        raise UsageError(f"--{given[0].replace('_', '-')} needs --aiter pinned")
    image = None
    if world["image"]:
        if world["aiter"]:
            raise UsageError("--image brings each commit's own AITER (the one its image was built with): "
                             "--aiter is for bare metal")
        try:
            cache = parse_size(world["image_cache_size"] or DEFAULT_IMAGE_CACHE_SIZE)
        except ValueError as exc:
            raise UsageError(f"--image-cache-size: {exc}") from None
        image = ImageSettings(check_template(world["image"]), world["container_runtime"] or "docker",
                              world["image_fallback"] or "skip", world["container_network"] or DEFAULT_NETWORK,
                              cache)
    aiter_sensitive = scenario is not None and scenario.aiter_sensitive
    aiter = world["aiter"] or ("installed" if aiter_sensitive and not image else "any")
    settings = WorldSettings(image, aiter, AiterSettings(world["aiter_cache_size"] or DEFAULT_AITER_CACHE_SIZE,
                                                        bool(world["aiter_prebuild"]), world["aiter_repo"],
                                                        rocm_arch))
    settings.check(scenario, env_mode, executor)
    return settings


def build_settings(build: str | None, python: str, rocm_arch: str | None, wheels: str | None,
                   cache_size: str, command: tuple[str, ...] = ()) -> BuildSettings:
    """The build options; without --build a -- CMD run builds nothing, as `git bisect run` does."""
    if build is None:
        build = "none" if command else "auto"
    try:
        return BuildSettings(build, python, rocm_arch, wheels, parse_size(cache_size))
    except ValueError as exc:
        raise UsageError(f"--cache-size: {exc}") from None


reuse_verdicts_option = click.option(
    "--reuse-verdicts", is_flag=True,
    help="Serve `-- CMD` verdicts of earlier runs too (keyed on the environment, volatile variables aside); "
         "by default a command's verdicts serve only its own run and that run's resumptions.")


def command_line() -> list[str]:
    """How this bisector was invoked, as an argument list (stored with the run, shown in reports), its
    credentials redacted (bisector.redact)."""
    return ["bisector", *redact_all(sys.argv[1:])]
