"""The seams a newcomer extends: a scenario plug-in package, a registered executor, and the rules that
keep the house in order (no import cycles, short signatures, reports that import no engine)."""
import ast
import json
import re
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from bisector.engine import executor as executors
from bisector.engine.config import RunConfig
from bisector.engine.run import run_bisection
from bisector.errors import UsageError
from bisector.registry import Option, Registry
from bisector.seams import ClassifiesLogs, Configurable, RecordsVersions, Scenario
from scenarios import available
from scenarios.command import CommandScenario

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bisector"
pytestmark = pytest.mark.integration


def test_an_installed_plugin_package_adds_a_scenario(make_repo, tmp_path, cli, wheel_build):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(ROOT / "examples" / "plugin-scenario")], check=True,
                   capture_output=True)
    env = {"PYTHONPATH": f"{ROOT}:{site}"}
    before = cli("scenario", "list")
    assert "file-marker" not in before.stdout
    listed = cli("scenario", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"file-marker \(source [0-9a-f]{8}, no build\)", listed.stdout)
    assert "aiter-mla-probe" in listed.stdout  # built-ins stay

    repo = make_repo()
    shas = repo.linear(12, bad_from=7)
    run = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                   "--scenario", "file-marker", "--option", "marker=bad", "--state-dir", str(tmp_path / "s"),
                   env=env)
    assert run.returncode == 0, run.stderr
    assert f"first bad commit: {shas[7]}" in run.stdout.splitlines()
    unknown = cli("scenario", "run", "file-marker", "--repo", str(repo.path), "--option", "nope=1",
                       env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "bisector: error: scenario 'file-marker' has no option 'nope' (known: marker, path)"]


class InlineExecutor:
    """A one-file executor: runs each step at once, in the driver's thread, in one worktree."""

    def __init__(self, placement: executors.Placement):
        self.size = 1
        self.ran: list[str] = []

    def start(self, pool, logs: Path) -> None:
        self.pool, self.logs = pool, logs

    def run_step(self, judge, sha: str, done: list) -> Future:
        future: Future = Future()
        with self.pool.checkout(sha) as worktree:
            future.set_result(judge.test(worktree, sha, done, self.logs, {}, None))
        self.ran.append(sha)
        return future

    def cancel(self, future: Future) -> None:
        future.cancel()

    def shutdown(self) -> None:
        pass


def test_a_registered_executor_runs_every_step(make_repo, tmp_path, monkeypatch, state_is_good):
    monkeypatch.setitem(executors.EXECUTORS, "inline", InlineExecutor)
    repo = make_repo()
    shas = repo.linear(16, bad_from=11)
    scenario = CommandScenario(state_is_good)
    chosen = executors.create_executor("inline", executors.Placement(1, None, None, 0, str(repo.path)))
    result = run_bisection(RunConfig(repo=repo.path, good=shas[0], bad=shas[-1], scenario=scenario,
                                     state_dir=tmp_path / "state", executor=chosen))
    assert result.culprit.sha == shas[11]
    assert sorted(chosen.ran) == sorted({step.sha for step in result.steps})
    assert len(chosen.ran) == result.executions


def _module_imports() -> dict[str, set[str]]:
    """bisector.* module -> the bisector.* modules it imports at module level."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        imported = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[name] = imported
    return {name: {m for m in deps if m in graph and m != name} for name, deps in graph.items()}


def test_no_import_cycle_among_core_modules():
    graph = _module_imports()
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in graph[module]:
            assert state.get(dep) != "open", "import cycle: " + " -> ".join(path + [module, dep])
            if dep not in state:
                visit(dep, path + [module])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [])


@pytest.fixture(scope="module")
def import_figures() -> dict:
    """bench/import_graph.py's figures: it reads every import of bisector.* and scenarios.*, function-level
    ones too, and what `from scenarios.base import BaseScenario` loads in a fresh interpreter."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "import_graph.py"), "--json"], capture_output=True,
                          text=True, cwd=ROOT)
    figures = json.loads(done.stdout)
    assert done.returncode == (1 if figures["cycles"] or figures["type_only_cycles"] else 0), done.stderr
    return figures


def test_import_graph_has_no_cycle_counting_imports_inside_functions(import_figures):
    figures = import_figures
    assert figures["cycles"] == [] and figures["type_only_cycles"] == []  # not even through type-only imports
    assert figures["modules"] >= 50 and figures["function_edges"]  # it saw the packages and the lazy imports
    # the seam types and GPU helpers live in the core: the core imports no scenario, even lazily
    assert not [edge for edge in figures["function_edges"] if edge.startswith("bisector.")
                and " -> scenarios" in edge and not edge.startswith(("bisector.cli ", "bisector.cli."))]


PLUGIN_KIT = {"__init__", "errors", "seams", "registry", "process", "step_leader", "signatures", "metrics", "redact"}


def test_the_package_root_holds_the_plugin_kit_alone_and_the_seams_import_no_other_module():
    root = {path.stem for path in PACKAGE.glob("*.py")}
    assert root == PLUGIN_KIT
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == {"builds", "cli", "engine", "machine", "record", "repo", "report", "search", "world"}
    seams = ast.parse((PACKAGE / "seams.py").read_text())
    imported = [node.module for node in ast.walk(seams) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if (name or "").startswith("bisector")], imported


def test_a_plugin_scenario_loads_a_handful_of_project_modules(import_figures):
    loaded = import_figures["plugin_imports"]
    assert "scenarios.base" in loaded and len(loaded) <= 10, loaded
    assert not {"bisector.engine", "bisector.engine.executor", "bisector.builds", "scenarios.dpa_fp8_kv"} & set(loaded)
    probe = "import sys; from scenarios.base import BaseScenario; print('git' in sys.modules)"
    git_loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True).stdout.strip()
    assert git_loaded == "False"  # nor GitPython


def test_reports_import_no_engine_and_core_imports_no_scenario_utilities():
    graph = _module_imports()
    engine = {name for name in graph if name == "bisector.engine" or name.startswith("bisector.engine.")}
    reports = [name for name in graph if name.startswith("bisector.report.")]
    assert "bisector.report.renderers" in reports
    for name in reports:
        assert not graph[name] & (engine | {"bisector.engine.backport", "bisector.search.policies"}), name
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "cli":
            continue  # the composition root wires scenarios in
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scenarios."):
                names = {alias.name for alias in node.names}
                assert names <= {"Cancelled", "StepContext", "Verdict", "Outcome"}, (path, names)


def test_architecture_names_every_core_module_and_only_modules_that_exist():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`((?:bisector|scenarios)/[\w/]+\.py)`", text))  # quoted paths (not the examples)
    modules = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")}
    assert modules - named == set()  # every bisector module has its row
    assert {name for name in named if not (ROOT / name).is_file()} == set()
    assert len(named & modules) >= 40  # the check saw the table


def test_no_function_in_the_core_takes_more_than_six_parameters():
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any("command" in ast.unparse(d) for d in node.decorator_list):
                continue  # click commands take one parameter per option
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            names = names[1:] if names[:1] in (["self"], ["cls"]) else names
            assert len(names) <= 6, f"{path.name}:{node.lineno} {node.name} takes {len(names)}"


def test_a_registry_imports_an_entry_when_first_asked_and_takes_its_aliases(tmp_path, monkeypatch):
    (tmp_path / "lazy_strategy.py").write_text("class Strategy:\n    name = 'lazy'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry = Registry("build strategy")
    registry.register("lazy", "lazy_strategy:Strategy", aliases=("old-name",),
                      options=[Option("--lazy-level", type=int, help="How lazy.")])
    registry.register("eager", dict)
    assert list(registry) == ["lazy", "eager"] and registry.choices() == ["lazy", "eager", "old-name"]
    assert [option.decls for option in registry.options()] == [("--lazy-level",)]
    assert "lazy_strategy" not in sys.modules  # names and options are known without importing anything
    assert registry["old-name"].name == "lazy" and "lazy_strategy" in sys.modules
    assert registry.canonical("old-name") == "lazy" and "old-name" in registry and registry["eager"] is dict
    with pytest.raises(UsageError, match=r"^unknown build strategy 'nope' \(known: lazy, eager\)$"):
        registry.entry("nope")


def test_each_registered_entry_brings_its_own_options_and_the_old_build_name_still_works(make_repo, cli):
    help_text = cli("run", "--help").stdout
    for option in ("--wheels", "--rocm-arch", "--gpus", "--ray-address", "--remote", "--cache-size"):
        assert option in help_text, option
    assert "reuse" in help_text and "|python|" not in help_text  # the alias is accepted, not offered
    repo = make_repo()
    sha = repo.linear(2, bad_from=None)[-1]
    for name in ("reuse", "python"):  # parsed, then the scenario is looked up
        judged = cli("scenario", "run", "no-such-scenario", "--repo", str(repo.path), "--ref", sha, "--build", name)
        assert judged.returncode == 2 and judged.stderr.startswith(
            "bisector: error: unknown scenario 'no-such-scenario' (available: "), judged.stderr
    refused = cli("scenario", "run", "no-such-scenario", "--repo", str(repo.path), "--ref", sha, "--build", "pyhton")
    assert refused.returncode == 2 and "'pyhton' is not one of 'auto', 'reuse'" in refused.stderr, refused.stderr


def test_optional_capabilities_are_protocols_checked_with_isinstance(state_is_good):
    command = CommandScenario(state_is_good)
    assert isinstance(command, Scenario) and isinstance(command, Configurable)
    assert isinstance(command, RecordsVersions) and not isinstance(command, ClassifiesLogs)
    assert issubclass(available()["dpa-fp8-kv-graph-capture"], ClassifiesLogs)
    assert not issubclass(available()["aiter-mla-probe"], ClassifiesLogs)
