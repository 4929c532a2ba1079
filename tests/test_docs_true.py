"""README.md says what the command line does: its command list names every command, its exit code table every
exit code the CLI's modules return (each in the rows of the commands that return it), and every option README and
docs/ show on a `bisector ...` line is an option of that command. The click group is walked in-process."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import click
import pytest

from bisector import errors
from bisector.cli import COMMANDS, main

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SPAN = re.compile(r"`([^`]+)`")  # a span may go on over a line break
# a command line in a code block, with the lines indented under it that go on with its options
CODE_LINE = re.compile(r"^ {4}(?:\$ )?(bisector .*(?:\n {6,}\S.*)*)$", re.MULTILINE)
OPTION = re.compile(r"^(-{1,2}[a-z][a-z0-9-]*)")
# the codes a cell lists: a number opening the cell, or after "; ", ", " or "(" (not "≥ 128", nor "128 + N": a signal)
LISTED_CODE = re.compile(r"(?:^|[;,(]\s*)(\d+)\b(?! \+ )")


def section(text: str, heading: str) -> str:
    """The body of README's `## heading` section."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def commands() -> dict[tuple[str, ...], click.Command]:
    """Every command and subcommand of the `bisector` group by its path, groups included."""
    ctx = click.Context(main)
    found: dict[tuple[str, ...], click.Command] = {}

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, name
            found[(*path, name)] = command
            if isinstance(command, click.Group):
                walk(command, (*path, name))

    walk(main, ())
    return found


def named(words: list[str], known: dict[tuple[str, ...], click.Command]) -> list[tuple[str, ...]]:
    """The command paths words name: `cache list\\|forget` names cache list and cache forget; [] for none."""
    if not words or (words[0],) not in known:
        return []
    head = (words[0],)
    if isinstance(known[head], click.Group) and len(words) > 1:
        subs = [(*head, sub) for sub in words[1].replace("\\|", "|").split("|") if (*head, sub) in known]
        if subs:
            return subs
    return [head]


def bisector_lines(text: str) -> list[str]:
    """Each `bisector ...` command line README shows, inline or in a code block, without `bisector `."""
    lines = [span for span in SPAN.findall(text) if span.startswith("bisector ")]
    return [line.removeprefix("bisector ") for line in lines + CODE_LINE.findall(text)]


def options_shown(line: str) -> list[str]:
    """The options line shows, up to a bare `--` before a real command (a usage's `-- CMD [ARGS...]` goes on)."""
    shown = []
    words = line.split()
    for word, after in zip(words, [*words[1:], ""]):
        if word == "--" and not after.startswith("CMD"):
            break
        for alternative in word.strip("[]()").replace("\\|", "|").split("|"):
            match = OPTION.match(alternative.strip("[]()"))
            if match:
                shown.append(match.group(1))
    return shown


def exit_table(text: str) -> dict[tuple[str, ...], set[int]]:
    """README's exit code table: each command path its rows name (else the row's name, e.g. `--version`), and
    the codes listed for it."""
    known = commands()
    table: dict[tuple[str, ...], set[int]] = {}
    for row in section(text, "Exit codes").splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
        if len(cells) != 2 or set(cells[0]) <= set("-") or cells[0] == "command":
            continue
        codes = {int(code) for code in LISTED_CODE.findall(cells[1])}
        paths = [path for span in SPAN.findall(cells[0]) for path in named(span.split(), known)]
        for path in paths or [(cells[0],)]:
            table.setdefault(path, set()).update(codes)
    return table


def codes_in(module_name: str) -> set[int]:
    """The exit codes a module takes from bisector.errors by name: EXIT_* constants and error classes."""
    tree = ast.parse(Path(importlib.import_module(module_name).__file__ or "").read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "bisector.errors" for alias in node.names}
    values = {getattr(errors, name) for name in names}
    return {value if isinstance(value, int) else value.exit_code for value in values
            if isinstance(value, int) or (isinstance(value, type) and issubclass(value, errors.BisectorError))}


def every_error_class(root: type) -> list[type]:
    return [root, *(each for sub in root.__subclasses__() for each in every_error_class(sub))]


def test_the_command_list_names_every_command_and_subcommand():
    known = commands()
    listed = {path for span in SPAN.findall(section(README.read_text(), "Commands"))
              for path in named(span.removeprefix("bisector ").split(), known)}
    leaves = {path for path, command in known.items() if not isinstance(command, click.Group)}
    assert leaves - listed == set(), "commands README's command list does not name"
    assert listed - set(known) == set(), "README's command list names what the CLI lacks"


def test_the_exit_code_table_lists_every_code_the_cli_uses():
    for module in {module for module, _, _ in COMMANDS.values()}:
        importlib.import_module(module)  # every command's errors defined, the record's StoreError among them
    importlib.import_module("bisector.record.store")
    used = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    used |= {error.exit_code for error in every_error_class(errors.BisectorError)}
    table = exit_table(README.read_text())
    listed = set().union(*table.values())
    assert used - listed == set(), "exit codes the CLI uses that README's exit code table lacks"
    assert listed - used == set(), "exit codes README lists that nothing returns"


def test_each_command_row_lists_the_codes_its_module_returns():
    table = exit_table(README.read_text())
    for name, (module, _, _) in COMMANDS.items():
        rows = {path: codes for path, codes in table.items() if path[0] == name}
        assert rows, f"README's exit code table has no row for {name}"
        for path, codes in rows.items():
            assert errors.EXIT_USAGE in codes, f"{' '.join(path)}: usage errors exit {errors.EXIT_USAGE}"
        missing = codes_in(module) - set().union(*rows.values())
        assert missing == set(), f"{name}: codes {module} returns that its rows lack"


def test_every_option_readme_and_docs_show_is_an_option_of_its_command():
    known = commands()
    shown = 0
    for line in (line for page in (README, *sorted((ROOT / "docs").glob("*.md")))
                 for line in bisector_lines(page.read_text())):
        paths = named(line.split(), known)
        if not paths:
            continue
        accepted = {"--help", "-h"} | {opt for path in paths for param in known[path].params
                                       for opt in (*param.opts, *param.secondary_opts)}
        for option in options_shown(line):
            shown += 1
            assert option in accepted, f"`bisector {line}` is shown: {' '.join(paths[0])} has no {option}"
    assert shown > 100  # the walk reads the pages' command lines, the usage blocks' continued lines too


def test_each_usage_in_docs_names_every_option_of_its_command():
    known = commands()
    usages = [line.removeprefix("bisector ") for page in sorted((ROOT / "docs").glob("*.md"))
              for line in CODE_LINE.findall(page.read_text()) if "[--" in line]
    described = set()
    for usage in usages:
        paths = named(usage.split(), known)
        assert len(paths) == 1, f"a usage of one command: bisector {usage}"
        shown = set(options_shown(usage))
        options = {param.opts[0]: param.opts for param in known[paths[0]].params if isinstance(param, click.Option)}
        missing = [first for first, spellings in options.items() if not shown & set(spellings)]
        assert missing == [], f"the usage of {' '.join(paths[0])} in docs/ lacks {missing}"
        described.add(paths[0])
    assert {("run",), ("backport",), ("shell",), ("scenario", "run"), ("doctor",)} <= described
