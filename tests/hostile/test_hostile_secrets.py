"""Hostile rows (issue 45, items 16, 17, 11; round three item 10): credentials reach no output and no row of the
record, whatever their shape and wherever they were given; a full disk or a file size limit is the machine's, never
a stored verdict."""
from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bisector.redact import redact
from bisector.report.formats import FORMATS

pytestmark = pytest.mark.integration

TOKENS = ("PRIVTOK", "QTOKEN", "FRAGTOK", "PASSWD")  # the other secrets the rows use


@pytest.fixture
def leaked(hostile):
    """leaked(text) -> the secrets text holds: SECRET, its tail past its first '@' (what a redaction stopping
    there leaves), TOKENS."""
    secrets = (hostile.SECRET, hostile.SECRET.split("@", 1)[1], *TOKENS)
    return lambda text: [secret for secret in secrets if secret in text]


# -- item 16: the shapes of a credential in a URL --------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("given, shown", [
    ("https://ci:{SECRET}@host/x.git", "https://***@host/x.git"),
    ("https://ci:{SECRET}@host", "https://***@host"),
    ("git clone https://ci:{SECRET}@host/x.git failed", "git clone https://***@host/x.git failed"),
    ("https://ci:pa:ss:PASSWD@host/x", "https://***@host/x"),
    ("https://ci:s3cr%40PASSWD%3A@host/x", "https://***@host/x"),
    ("https:/ci:{SECRET}@host/x", "https:/***@host/x"),  # a URL a path normalisation squeezed
    ("ray://ci:{SECRET}@127.0.0.1:10001", "ray://***@127.0.0.1:10001"),
    ("'https://ci:{SECRET}@host/x' and user@example.com", "'https://***@host/x' and user@example.com"),
    ("https://a:{SECRET}@h1/a.git,https://b:{SECRET}@h2/b.git", "https://***@h1/a.git,https://***@h2/b.git"),
    ("https://host/x.git?private_token=PRIVTOK&ref=main", "https://host/x.git?private_token=***&ref=main"),
    ("https://host/x?token=QTOKEN", "https://host/x?token=***"),
    ("https://host/x?a=1&access_token=QTOKEN#top", "https://host/x?a=1&access_token=***#top"),
    ("https://host/x?password=p@ss:PASSWD&b=2", "https://host/x?password=***&b=2"),
    ("https://host/cb#access_token=FRAGTOK&state=1", "https://host/cb#access_token=***&state=1"),
    ("https://github.com/org/pkg@v1.2 user@example.com", "https://github.com/org/pkg@v1.2 user@example.com"),
    # round three, item 10: every RFC 3986 sub-delim in a password, and query keys that end in key
    *((f"https://ci:pa{c}ss{{SECRET}}@host/x", "https://***@host/x") for c in "!$&'()*+,;="),
    *((f"https://host/x?{key}=QTOKEN&ref=main", f"https://host/x?{key}=***&ref=main")
      for key in ("api_key", "apiKey", "x-api-key", "accessKey", "ACCESS_KEY", "private-key", "sessionkey")),
])
def test_every_shape_of_a_credential_in_a_url_is_redacted_whole(hostile, given, shown):
    assert redact(given.format(SECRET=hostile.SECRET)) == shown
    assert redact(shown) == shown


def test_a_password_with_at_signs_reaches_no_output_and_no_row(make_repo, tmp_path, cli, hostile, leaked):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    url = f"https://ci:{hostile.SECRET}@wheels.example.com/{{commit}}/?private_token=PRIVTOK"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--wheels", url, "--json", str(tmp_path / "run.json"), "--markdown", str(tmp_path / "run.md"),
               "--", "sh", "-c", f"echo 'fatal: could not read {url}'; grep -q good state")
    assert proc.returncode == 0, proc.stderr
    assert "https://***@wheels.example.com/{commit}/?private_token=***" in proc.stdout
    outputs = {"run": proc.stdout + proc.stderr, "--json": (tmp_path / "run.json").read_text(),
               "--markdown": (tmp_path / "run.md").read_text()}
    for fmt in FORMATS:
        shown = cli("report", "1", "--repo", str(repo.path), "--state-dir", str(state), "--format", fmt)
        assert shown.returncode == 0, shown.stderr
        outputs[f"report {fmt}"] = shown.stdout
    for command in (("runs",), ("cache", "list")):
        listed = cli(*command, "--repo", str(repo.path), "--state-dir", str(state))
        assert listed.returncode == 0, listed.stderr
        outputs[" ".join(command)] = listed.stdout + listed.stderr
    assert "wheels.example.com" in outputs["runs"]
    assert {name: leaked(text) for name, text in outputs.items() if leaked(text)} == {}
    assert "wheels.example.com" in hostile.record_text(state) and leaked(hostile.record_text(state)) == []


@pytest.mark.parametrize("url", [
    "https://ci:pa'ss{SECRET}@wheels.example.com/{{commit}}/",
    "https://wheels.example.com/{{commit}}/?x-api-key=QTOKEN",
    "https://wheels.example.com/{{commit}}/?accessKey=QTOKEN&api_key=PRIVTOK",
], ids=["a quote in the password", "x-api-key", "accessKey and api_key"])
def test_a_credential_of_any_shape_in_an_option_reaches_no_output_and_no_row(make_repo, tmp_path, cli, hostile,
                                                                           leaked, url):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--no-verify-endpoints", "--wheels", url.format(SECRET=hostile.SECRET), "--", "true")
    assert "wheels.example.com" in proc.stdout, proc.stdout + proc.stderr
    assert leaked(proc.stdout + proc.stderr) == []
    assert "wheels.example.com" in hostile.record_text(state) and leaked(hostile.record_text(state)) == []


# -- item 17: a credential given anywhere is redacted before it is stored -----------------------------------
def test_a_credential_in_a_marks_reason_is_not_stored(make_repo, tmp_path, cli, hostile, leaked):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    stopped = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
                  "--", "false")  # GOOD tests bad: the run stops at its endpoint check, a run that takes marks
    assert stopped.returncode != 0, stopped.stdout
    reason = f"seen at https://ci:{hostile.SECRET}@ci.example.com/job/7?private_token=PRIVTOK"
    marked = cli("mark", "latest", shas[1], "skip", "--reason", reason, "--repo", str(repo.path),
                 "--state-dir", str(state))
    assert marked.returncode == 0, marked.stderr
    assert leaked(marked.stdout + marked.stderr) == []
    assert "ci.example.com/job/7" in hostile.record_text(state) and leaked(hostile.record_text(state)) == []


def test_doctor_shows_a_configured_url_redacted(make_repo, cli, hostile, leaked):
    repo = make_repo()
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "bisector" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'aiter_repo = "https://ci:{hostile.SECRET}@git.example.com/aiter.git?private_token=PRIVTOK"\n')
    proc = cli("doctor", "--repo", str(repo.path))
    assert proc.returncode == 0, proc.stderr
    assert f"config aiter_repo: https://***@git.example.com/aiter.git?private_token=*** ({config})" in proc.stdout
    assert leaked(proc.stdout + proc.stderr) == []


def test_a_ray_address_with_a_credential_in_the_stop_reason_is_not_stored(make_repo, tmp_path, cli, hostile,
                                                                               leaked):
    pytest.importorskip("ray")
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--executor", "ray", "--ray-address", f"ray://ci:{hostile.SECRET}@127.0.0.1:9", "--", "true",
               env={"RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"})
    assert proc.returncode == 4, proc.stderr
    assert "cannot start or reach Ray at ray://***@127.0.0.1:9" in proc.stderr
    shown = cli("report", "1", "--repo", str(repo.path), "--state-dir", str(state))
    assert "ray://***@127.0.0.1:9" in shown.stdout
    record = hostile.record_text(state)
    assert "cannot start or reach Ray at ray://***@127.0.0.1:9" in record
    assert leaked(proc.stdout + proc.stderr + shown.stdout + record) == []


# -- item 11: a full disk or a file size limit is the machine's, never a stored verdict ---------------------
LIMIT = 256 * 1024  # bytes any file may grow to under `ulimit -f`: the record fits, a step's big output does not


def limited_cli(project_root: Path, git_env: dict, limit: int | None, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, under `ulimit -f` (RLIMIT_FSIZE) of limit bytes when given."""
    def under_limit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run([sys.executable, "-m", "bisector.cli", *args], capture_output=True, text=True,
                          timeout=300, preexec_fn=under_limit,
                          env={**os.environ, **git_env, "PYTHONPATH": str(project_root)})


@pytest.mark.parametrize("step, seen", [
    # the step's output outgrows the limit: the tool cannot write its log ("cannot start sh: File too large")
    (f"head -c {2 * LIMIT} /dev/zero | tr '\\0' x; grep -q good state", "File too large"),
    # the step itself writes a file past the limit (SIGXFSZ; where ignored, EFBIG made it exit 1: "bad")
    (f"grep -q good state || exit 1; exec head -c {2 * LIMIT} /dev/zero > big", "SIGXFSZ"),
], ids=["the step's log", "the step's own file"])
def test_a_file_size_limit_is_no_verdict_and_the_rerun_tests_the_commit(make_repo, tmp_path, project_root,
                                                                        git_env, hostile, step, seen):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)  # the probe, shas[1], is good
    state = tmp_path / "state"

    def run(limit: int | None, name: str) -> dict:
        out = tmp_path / f"{name}.json"
        proc = limited_cli(project_root, git_env, limit, "run", "--repo", str(repo.path), "--good", shas[0],
                           "--bad", shas[-1], "--state-dir", str(state), "--no-verify-endpoints",
                           "--reuse-verdicts", "--json", str(out), "--", "sh", "-c", step)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 1), proc.stderr
        return json.loads(out.read_text())

    limited = run(LIMIT, "limited")
    [probe] = limited["steps"]
    assert (probe["sha"], probe["verdict"], probe["cached"]) == (shas[1], "skip", False), probe
    assert seen in probe["reason"] and probe["details"]["cause"] == "machine", probe
    assert probe["reason"].endswith("(not cached: the machine, not the commit)")
    with sqlite3.connect(state / "bisector.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == 0  # nothing stored as a verdict
    free = run(None, "free")
    [probe] = free["steps"]
    assert (probe["sha"], probe["verdict"], probe["cached"]) == (shas[1], "good", False), probe
    assert free["executions"] == 1 and free["first_bad"]["sha"] == shas[2]
