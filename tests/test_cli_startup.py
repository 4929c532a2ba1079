"""The command line imports a command's module only when that command is asked for: `bisector --help` loads
click and the command map, and still lists every command with its one-line help."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisector.cli import COMMANDS, main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
# bisector's main() with the given arguments, then the project modules (and GitPython, rich) it loaded, on stderr
PROBE = ("import json, sys; sys.argv = ['bisector', *sys.argv[1:]]; from bisector.cli import main\n"
         "try:\n    main()\nexcept SystemExit:\n    pass\n"
         "print(json.dumps(sorted(m for m in sys.modules if m.partition('.')[0] in "
         "('bisector', 'scenarios', 'git', 'rich'))), file=sys.stderr)")


def loaded_by(*args: str) -> tuple[str, list[str]]:
    """(stdout, the modules loaded) of `bisector *args` in a fresh interpreter, 80 columns wide."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          check=True)
    return done.stdout, json.loads(done.stderr.splitlines()[-1])


def test_top_level_help_loads_the_map_only_and_lists_every_command_with_its_help():
    stdout, loaded = loaded_by("--help")
    assert loaded == ["bisector", "bisector.cli", "bisector.errors"]
    listed = stdout.split("Commands:\n", 1)[1].splitlines()
    limit = 78 - 6 - max(map(len, COMMANDS))  # click: 80 columns less 2, less the spacing and the longest name
    expected = {name: main.get_command(None, name).get_short_help_str(limit) for name in COMMANDS}
    assert {line.split(None, 1)[0]: line.split(None, 1)[1] for line in listed} == expected
    assert set(expected) == {"backport", "cache", "demo", "doctor", "env", "mark", "report", "run", "runs",
                             "scenario", "shell"}


def test_the_map_carries_each_commands_own_first_paragraph():
    for name, (_, _, summary) in COMMANDS.items():
        command = main.get_command(None, name)
        assert command.name == name
        assert " ".join(command.help.split("\n\n")[0].split()) == summary, name


def test_a_commands_help_loads_its_own_module_not_the_others():
    stdout, loaded = loaded_by("run", "--help")
    assert "--good" in stdout and "bisector.cli.run" in loaded
    assert not {"bisector.cli.backport", "bisector.cli.scenario", "bisector.cli.cache", "bisector.cli.env",
                "bisector.cli.report", "bisector.cli.demo", "bisector.cli.doctor", "bisector.engine.run",
                "scenarios"} & set(loaded)


def test_a_mistyped_command_is_refused_with_the_nearest_name(cli):
    proc = cli("rnu")
    assert proc.returncode == 2
    assert proc.stderr == "bisector: error: No such command 'rnu'. Did you mean 'run'?\n"
