"""Fault signatures: a long bisection that meets another crash never blames it (--signature auto), and
`scenario calibrate` measures how often each end fails (the signatures and rules alone: test_decisions.py)."""
import json
import textwrap

import pytest

from bisector.signatures import failure_signature

pytestmark = pytest.mark.integration

HSA_FAULT = ("Memory access fault by GPU node-2 (Agent handle: 0x55d5c8a0b1c0) on address 0x7f1e2c000000. "
             "Reason: Page not present or supervisor privilege.")
# A crash judge: the checkout's `state` file says what the commit does.
CRASH_JUDGE = textwrap.dedent(f"""\
    import os, signal, sys
    state = open("state").read().strip()
    if state == "import":
        print("(EngineCore_DP0 pid=4242) Traceback (most recent call last):")
        print("(EngineCore_DP0 pid=4242) ImportError: cannot import name 'fused_moe' from 'vllm._C'")
        print("RuntimeError: Engine core initialization failed. See root cause above.")
        sys.exit(1)
    if state == "fault":
        print("Capturing CUDA graphs (decode, FULL):  92%|#########2| 47/51")
        print({HSA_FAULT!r}, flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
    """)


@pytest.fixture
def crash_history(make_repo, tmp_path):
    """30 commits: 0-9 good, 10-19 fail with an ImportError, 20-29 fault on the GPU (the culprit is 20)."""
    repo = make_repo()
    shas = [repo.commit(f"change {i}", {"state": "good\n" if i < 10 else "import\n" if i < 20 else "fault\n",
                                        "counter": f"{i}\n"}) for i in range(30)]
    judge = tmp_path / "judge.py"
    judge.write_text(CRASH_JUDGE)
    return repo, shas, judge


def test_another_crash_is_never_blamed_with_signature_auto(crash_history, tmp_path, cli):
    repo, shas, judge = crash_history
    common = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"))
    anything = cli(*common, "--json", str(tmp_path / "any.json"), "--", "python3", str(judge))
    assert anything.returncode == 0, anything.stderr
    assert json.loads((tmp_path / "any.json").read_text())["first_bad"]["sha"] == shas[10]  # the ImportError

    auto = cli(*common, "--signature", "auto", "--json", str(tmp_path / "auto.json"), "--",
                    "python3", str(judge))
    result = json.loads((tmp_path / "auto.json").read_text())
    assert result["signature"] == {"mode": "auto", "pattern": None,
                                   "signature": "GPU memory access fault during CUDA-graph capture"}
    assert result["first_bad"] is None  # the ImportError skips hide which of the candidates is first bad
    assert shas[20] in result["candidates"]
    assert set(result["candidates"]) <= set(shas[10:21])
    import_steps = [s for s in result["steps"] if s["sha"] in shas[10:20]]
    assert import_steps and all(s["verdict"] == "skip" and s["reason"].startswith("different failure: ImportError")
                                for s in import_steps)
    assert auto.returncode == 1  # skips block the answer: the candidates are reported, as git does
    assert "signature (auto): GPU memory access fault during CUDA-graph capture" in auto.stdout

    # A regex names the hunted fault directly: the ImportErrors are skips there too (inconclusive).
    assert cli(*common, "--signature", "GPU memory", "--no-verify-endpoints", "--", "python3",
                    str(judge)).returncode == 1


def test_calibrate_measures_both_ends(crash_history, tmp_path, cli):
    repo, shas, judge = crash_history
    flaky = tmp_path / "flaky.sh"  # the bad end faults on every other run; the good end never fails
    flaky.write_text(f"#!/bin/sh\ngrep -q fault state || exit 0\n"
                     f"n=$(cat {tmp_path}/count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {tmp_path}/count\n"
                     f"[ $((n % 2)) -eq 0 ] && exit 0\nexec python3 {judge}\n")
    flaky.chmod(0o755)
    out = cli("scenario", "calibrate", "command", "--repo", str(repo.path), "--good", shas[0],
                   "--bad", shas[-1], "--runs", "4", "--state-dir", str(tmp_path / "state"),
                   "--json", str(tmp_path / "cal.json"), "--", str(flaky))
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "cal.json").read_text())
    assert (result["bad"]["runs"], result["bad"]["bad"], result["good"]["bad"]) == (4, 2, 0)
    assert result["reproduction_rate"] == 0.5
    assert result["signature"] == "GPU memory access fault during CUDA-graph capture"
    assert "--repeat 5" in result["recommendation"] and "--fault-rate 0.50" in result["recommendation"]
    assert "reproduction rate: 50%" in out.stdout

    steady = cli("scenario", "calibrate", "command", "--repo", str(repo.path), "--good", shas[0],
                      "--bad", shas[-1], "--runs", "2", "--state-dir", str(tmp_path / "state"), "--",
                      "python3", str(judge))
    assert "reproduces on every run: plain bisection" in steady.stdout, steady.stderr
    missing = cli("scenario", "calibrate", "command", "--repo", str(repo.path), "--good", shas[0],
                       "--bad", shas[-1])
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_real_h200_records_have_distinct_signatures(project_root, cli):
    records = project_root / "tests" / "records"
    fault = (records / "h200-c8-planted-fault.log").read_text(errors="replace")
    imported = (records / "h200-c5-import-error.log").read_text(errors="replace")
    assert failure_signature(fault, -6) == "GPU illegal memory access during CUDA-graph capture"
    assert failure_signature(imported, 1) == "ImportError"
    classified = cli("scenario", "classify", "dpa-fp8-kv-graph-capture", "--option", "platform=cuda",
                     "--log", str(records / "h200-c8-planted-fault.log"), "--exit-code", "1", "--json")
    assert classified.returncode == 1, classified.stderr
    assert json.loads(classified.stdout)["details"]["signature"] == \
        "GPU illegal memory access during CUDA-graph capture"
