"""Defaults from configuration: the user's file, the repository's pyproject.toml, BISECTOR_* variables.

Precedence, highest first: the command line, the environment (`BISECTOR_<KEY>`), the repository being
bisected (`[tool.bisector]` in the pyproject.toml at its top), the user's file
(`$XDG_CONFIG_HOME/bisector/config.toml`, default `~/.config/bisector/config.toml`, keys at its top level).
The command line wins through click itself: the loaded values become the commands' `default_map`
(bisector.cli), which click consults only for an option not given. Read when a command runs, never for
`bisector --help`.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bisector.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: setup.cfg installs tomli there
    import tomli as tomllib  # type: ignore[import-not-found]

ENV_PREFIX = "BISECTOR_"
REPOSITORY_TABLE = "tool.bisector"


@dataclass(frozen=True)
class Key:
    """One configuration key: the command-line parameter it is the default of, and its default in words."""

    parameter: str  # the click parameter's name
    option: str  # how the command line spells it
    default: str
    path: bool = False  # `~` expanded; a relative path in a file is taken from that file's folder


KEYS: dict[str, Key] = {
    "aiter_repo": Key("aiter_repo", "--option aiter_repo", "the repository each commit pins (ROCm/aiter)",
                      path=True),
    "executor": Key("executor_kind", "--executor", "local"),
    "gpus": Key("gpus", "--gpus", "every visible GPU"),
    "image": Key("image", "--image", "none: steps run on this machine"),
    "state_dir": Key("state_dir", "--state-dir", "<git dir>/bisector", path=True),
}


@dataclass(frozen=True)
class Setting:
    value: str
    source: str  # where it was read: a file (and table), or $VARIABLE


@dataclass(frozen=True)
class Config:
    """The configured values by key (a key configured nowhere is absent)."""

    settings: Mapping[str, Setting]

    def defaults(self) -> dict[str, str]:
        """The values as click's default_map takes them: parameter name -> value."""
        return {KEYS[key].parameter: setting.value for key, setting in self.settings.items()}

    def source_of(self, parameter: str) -> str:
        """Where the configured default of the click parameter came from."""
        return next(setting.source for key, setting in self.settings.items() if KEYS[key].parameter == parameter)

    def lines(self, given: Mapping[str, str] = {}) -> list[str]:
        """`key: value (source)` for every key, the precedence first; given: keys the command line set."""
        lines = ["config: command line > environment (BISECTOR_*) > repository ([tool.bisector] in "
                 "pyproject.toml) > user file"]
        for key, spec in KEYS.items():
            if key in given:
                value, source = given[key], f"command line, {spec.option}"
            elif key in self.settings:
                value, source = self.settings[key].value, self.settings[key].source
            else:
                value, source = spec.default, "default"
            lines.append(f"config {key}: {value} ({source})")
        return lines


def user_file(env: Mapping[str, str]) -> Path:
    """The user's config.toml: under $XDG_CONFIG_HOME when it is an absolute path, else ~/.config."""
    base = env.get("XDG_CONFIG_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".config") / "bisector" / "config.toml"


def repository_file(repo: str | Path) -> Path | None:
    """The pyproject.toml at the top of the repository holding repo (None outside a repository)."""
    start = Path(os.path.abspath(repo))
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder / "pyproject.toml"
    return None


def load(repo: str | Path, env: Mapping[str, str] = os.environ) -> Config:
    """The configuration seen from repo; UsageError (one line, the file named) for a file that is not
    valid TOML, an unknown key or a value of the wrong type."""
    settings: dict[str, Setting] = {}
    repository = repository_file(repo)
    for path, table in ((user_file(env), None), (repository, REPOSITORY_TABLE)):
        if path is None or not path.is_file():
            continue
        source = f"{path} [{table}]" if table else str(path)
        for key, value in _read(path, table).items():
            if key not in KEYS:
                raise UsageError(f"{source}: unknown key {key!r} (known: {', '.join(KEYS)})")
            settings[key] = Setting(_value(path, source, key, value), source)
    for key in KEYS:
        variable = ENV_PREFIX + key.upper()
        if env.get(variable, "").strip():  # set but empty counts as unset
            value = env[variable]
            settings[key] = Setting(_expand_home(value) if KEYS[key].path else value, f"${variable}")
    return Config(settings)


def _read(path: Path, table: str | None) -> dict[str, Any]:
    """The file's table (its top level when table is None), {} when it has none."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r" \(at line (\d+), column \d+\)$", message)
        line = found.group(1) if found else str(len(path.read_bytes().splitlines()) or 1)
        reason = message[:found.start()] if found else message.replace(" (at end of document)", "")
        raise UsageError(f"{path}:{line}: not valid TOML: {reason}") from None
    for name in table.split(".") if table else ():
        document = document.get(name, {})
        if not isinstance(document, dict):
            raise UsageError(f"{path}: [{table}] is not a table")
    return document


def _value(path: Path, source: str, key: str, value: Any) -> str:
    """The value as the command line would spell it: a path with `~` expanded, a relative one taken from the
    file's folder (state_dir always, aiter_repo when it exists there: else it may be a `host:path` remote)."""
    if key == "gpus" and isinstance(value, list) and value and all(type(item) is int for item in value):
        return ",".join(map(str, value))
    if key == "gpus" and type(value) is int:
        return str(value)
    if not isinstance(value, str) or not value.strip():
        wanted = "a non-empty string" + (" or a list of GPU ids" if key == "gpus" else "")
        raise UsageError(f"{source}: {key} must be {wanted}, got {value!r}")
    if KEYS[key].path and "://" not in value:
        value = _expand_home(value)
        if not os.path.isabs(value) and (key == "state_dir" or (path.parent / value).exists()):
            return os.path.normpath(path.parent / value)
    return value


def _expand_home(value: str) -> str:
    """A path value with a leading `~` or `~user` expanded, as a shell would (a URL is left as it is)."""
    return value if "://" in value else os.path.expanduser(value)
