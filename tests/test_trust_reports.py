"""Issue 31 ("Trust, part 2"): a daemon holding a step's output ends no run's control; every report is
well-formed whatever the output held; credentials never reach an output or the record; logs belong
to their run. Each test runs the real CLI on real repositories."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bisector.report.formats import FORMATS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def daemons(tmp_path):
    """A file steps append their setsid daemons' pids to; every daemon listed is killed on teardown."""
    pids = tmp_path / "daemon-pids"
    yield pids
    if pids.exists():
        for pid in pids.read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def daemon_step(tmp_path: Path, pids: Path, then: str = "grep -q good state") -> str:
    """A step that leaves a setsid daemon writing to its stdout forever, then judges the commit."""
    return script(tmp_path / "daemon-step.sh", f"""\
        setsid sh -c 'echo $$ >> {pids}; while :; do echo x; sleep 0.1; done' &
        while [ ! -s {pids} ]; do sleep 0.01; done
        {then}
        """)


# 1. A daemon that left the step's group and holds its output does not hang the run.
def test_a_setsid_daemon_writing_to_the_output_does_not_hang_the_run(make_repo, tmp_path, cli, daemons):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
               "--", daemon_step(tmp_path, daemons), timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert shas[1] in proc.stdout


def test_a_sigterm_ends_a_run_whose_step_left_a_daemon_on_its_output(make_repo, tmp_path, git_env, daemons,
                                                                     wait_for):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    # the step exits at once: the driver is then reading the output a daemon holds open
    driver = subprocess.Popen([sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path),
                               "--good", shas[0], "--bad", shas[-1], "--",
                               daemon_step(tmp_path, daemons, then="exit 0")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, **git_env, "PYTHONPATH": str(ROOT)})
    try:
        assert wait_for(lambda: daemons.exists() and daemons.read_text().strip()), "no step started"
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(240) in (0, 1, 130)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def report(cli, repo, state: Path, fmt: str, run: str = "1") -> str:
    proc = cli("report", run, "--repo", str(repo.path), "--state-dir", str(state), "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


class _StrictHTML(HTMLParser):
    """html.parser, counting the tags it opens (it raises on nothing it cannot read)."""

    def __init__(self):
        super().__init__()
        self.tags = 0

    def handle_starttag(self, tag, attrs):
        self.tags += 1


# 4. Every report is well-formed whatever the step output and the commit subjects held.
def test_every_report_format_renders_ansi_control_characters_and_binary_output(make_repo, tmp_path, cli):
    repo = make_repo()
    good = repo.linear(2, bad_from=None)
    culprit = repo.commit("break \x1b[31mit\x1b[0m \x01\x02\x7f here", {"state": "bad\n"})
    bad = repo.linear(1, bad_from=0, start=5)
    state = tmp_path / "state"
    step = script(tmp_path / "colour.sh", """\
        printf '\\033[1;31mFAILED\\033[0m test_x \\001\\002 \\377\\376 \\000 end\\n'
        grep -q good state
        """)
    proc = cli("run", "--repo", str(repo.path), "--good", good[0], "--bad", bad[-1],
               "--state-dir", str(state), "--", step)
    assert proc.returncode == 0, proc.stderr
    assert culprit in proc.stdout
    for fmt in FORMATS:
        text = report(cli, repo, state, fmt)
        assert "\x1b" not in text and "\x00" not in text and "\x01" not in text, fmt
        if fmt == "junit":
            root = ET.fromstring(text.encode())
            outputs = [out.text or "" for out in root.iter("system-out")]
            assert any("FAILED test_x" in out for out in outputs), outputs
            assert any("break it \\x01\\x02" in out for out in outputs), outputs
        elif fmt == "html":
            parser = _StrictHTML()
            parser.feed(text)
            parser.close()
            assert parser.tags and "FAILED test_x" in text
        elif fmt == "json":
            assert json.loads(text)["first_bad"]["sha"] == culprit


# 5. Credentials in URLs reach no output and not the record.
SECRETS = ("SECRETPW", "SECRETTOK", "SECRETSIG")


def test_credentials_in_urls_reach_no_output_report_or_record(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    url = "https://user:SECRETPW@wheels.example.com/{commit}/?token=SECRETTOK&X-Amz-Signature=SECRETSIG"
    step = script(tmp_path / "fetch.sh", f"""\
        echo "fatal: could not read {url}"
        grep -q good state
        """)
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
               "--wheels", url, "--json", str(tmp_path / "run.json"), "--markdown", str(tmp_path / "run.md"),
               "--", step)
    assert proc.returncode == 0, proc.stderr
    assert "https://***@wheels.example.com/{commit}/?token=***&X-Amz-Signature=***" in proc.stdout
    outputs = {"stdout": proc.stdout, "stderr": proc.stderr,
               "--json": (tmp_path / "run.json").read_text(), "--markdown": (tmp_path / "run.md").read_text()}
    outputs.update({fmt: report(cli, repo, state, fmt) for fmt in FORMATS})
    runs = cli("runs", "--repo", str(repo.path), "--state-dir", str(state))
    outputs["runs"] = runs.stdout + runs.stderr
    refused = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
                  str(state), "--build", "precompiled", "--wheels", url.replace("{commit}", "x"), "--", step)
    assert refused.returncode == 2 and "https://***@wheels.example.com/x/?token=***" in refused.stderr
    outputs["error"] = refused.stderr
    for name, text in outputs.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} in {name}"
    assert "fatal: could not read https://***@" in outputs["html"]
    records = b"".join(path.read_bytes() for path in state.glob("bisector.sqlite*"))
    assert records and b"wheels.example.com" in records
    for secret in SECRETS:
        assert secret.encode() not in records


# 6. Logs belong to their run: a --no-cache rerun leaves the earlier run's logs as they were.
def test_a_no_cache_rerun_keeps_the_earlier_runs_logs(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = repo.linear(3, bad_from=1)
    state = tmp_path / "state"
    counter = tmp_path / "counter"
    step = script(tmp_path / "count.sh", f"""\
        echo x >> {counter}
        echo "output $(wc -l < {counter})"
        grep -q good state
        """)
    args = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir", str(state),
            "--no-cache", "--", step)
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    printed = len(counter.read_text().splitlines())
    second = cli(*args)
    assert second.returncode == 0, second.stderr
    assert len(counter.read_text().splitlines()) == 2 * printed
    logs = {run: [step["log"] for step in json.loads(report(cli, repo, state, "json", str(run)))["steps"]]
            for run in (1, 2)}
    assert logs[1] and not set(logs[1]) & set(logs[2])
    outputs = {run: {int(Path(log).read_text().split()[1]) for log in paths} for run, paths in logs.items()}
    assert outputs[1] == set(range(1, printed + 1))
    assert outputs[2] == set(range(printed + 1, 2 * printed + 1))
    assert all(log in report(cli, repo, state, "html", "1") for log in logs[1])


def test_a_credential_in_a_scenario_option_reaches_no_output_or_record(make_repo, tmp_path, cli):
    """A named scenario's options are part of its verdict cache key, which the record keeps: redacted there too."""
    repo = make_repo()
    shas = repo.linear(2, bad_from=None)
    state = tmp_path / "state"
    proc = cli("scenario", "run", "aiter-mla-probe", "--repo", str(repo.path), "--ref", shas[-1],
               "--state-dir", str(state), "--json", str(tmp_path / "outcome.json"),
               "--option", "aiter_repo=https://user:SECRETPW@127.0.0.1:9/aiter.git?token=SECRETTOK")
    said = proc.stdout + proc.stderr + (tmp_path / "outcome.json").read_text()
    assert "127.0.0.1:9/aiter.git" in said and "SECRETPW" not in said and "SECRETTOK" not in said
    records = b"".join(path.read_bytes() for path in state.glob("bisector.sqlite*"))
    assert b"127.0.0.1:9/aiter.git" in records  # the key's parts were stored, the credential was not
    assert b"SECRETPW" not in records and b"SECRETTOK" not in records
