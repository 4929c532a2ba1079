"""One pattern for the named implementations of a seam: scenarios, executors, build strategies, report formats.

An entry is registered under the name the command line takes, with its implementation (the object itself,
or "module:attribute", imported on first use so that listing names and options imports nothing), the
names it also answers to, and the command-line options it adds to the commands that offer it:

    EXECUTORS = Registry("executor")
    EXECUTORS.register("ray", "bisector.engine.executor:RayExecutor.from_placement",
                       options=[Option("--ray-address", help="...")])

A Registry is a mapping from name to the loaded implementation, so `registry[name]`, iteration (names,
in registration order) and `monkeypatch.setitem` work as on a dict.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from bisector.errors import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """A command-line option an entry adds: click.option's parameter declarations and settings."""

    decls: tuple[str, ...]
    settings: dict[str, Any]

    def __init__(self, *decls: str, **settings: Any):
        object.__setattr__(self, "decls", decls)
        object.__setattr__(self, "settings", settings)


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    target: T | str  # the implementation, or "module:attribute" still to import
    options: tuple[Option, ...] = ()
    aliases: tuple[str, ...] = ()
    loaded: bool = field(default=False, compare=False)


class Registry(MutableMapping[str, T]):
    """Named implementations of one seam, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind  # what an entry is, for messages: "executor", "build strategy", ...
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, target: T | str, *, options: tuple[Option, ...] | list[Option] = (),
                 aliases: tuple[str, ...] = ()) -> None:
        """Add (or replace) the entry `name`; a string target is "module:attribute", imported on first use."""
        self._entries[name] = Entry(name, target, tuple(options), tuple(aliases), not isinstance(target, str))

    def canonical(self, name: str) -> str:
        """The entry name `name` stands for (itself, or the entry it is an alias of)."""
        if name in self._entries:
            return name
        return next((entry.name for entry in self._entries.values() if name in entry.aliases), name)

    def entry(self, name: str) -> Entry[T]:
        """The entry called (or aliased) name; UsageError naming the known ones when there is none."""
        found = self._entries.get(self.canonical(name))
        if found is None:
            raise UsageError(f"unknown {self.kind} {name!r} (known: {', '.join(self._entries) or 'none'})")
        return found

    def choices(self) -> list[str]:
        """Every name the command line accepts: the entries', then their aliases."""
        return [*self._entries, *(alias for entry in self._entries.values() for alias in entry.aliases)]

    def options(self) -> list[Option]:
        """Every entry's command-line options, in registration order (an option two entries share once)."""
        found: dict[tuple[str, ...], Option] = {}
        for entry in self._entries.values():
            for option in entry.options:
                found.setdefault(option.decls, option)
        return list(found.values())

    def __getitem__(self, name: str) -> T:
        found = self._entries.get(self.canonical(name))
        if found is None:
            raise KeyError(name)
        if not found.loaded:
            module, _, attribute = str(found.target).partition(":")
            value: Any = importlib.import_module(module)
            for part in attribute.split("."):
                value = getattr(value, part)
            found = replace(found, target=value, loaded=True)
            self._entries[found.name] = found
        return found.target  # type: ignore[return-value]  # loaded: the implementation itself

    def __setitem__(self, name: str, value: T) -> None:
        """Register value as name, keeping an existing entry's options and aliases."""
        old = self._entries.get(name)
        self.register(name, value, options=old.options if old else (), aliases=old.aliases if old else ())

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.canonical(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
