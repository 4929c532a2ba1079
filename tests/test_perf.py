"""Performance hunts (`run --metric`, issue 35) on built histories: a seeded benchmark (tests/helpers/
perf_bench.py) with run-to-run noise and a planted slowdown, bisected through the real CLI."""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "helpers" / "perf_bench.py"


def bench(tmp_path: Path, *args: str) -> list[str]:
    return ["--", sys.executable, str(BENCH), "--runs-dir", str(tmp_path / "runs"), *args]


def hunt(cli, repo, good: str, bad: str, tmp_path: Path, *options: str, bench_args=()):
    out = tmp_path / "out.json"
    result = cli("run", "--repo", str(repo.path), "--good", good, "--bad", bad, "--state-dir",
                 str(tmp_path / "state"), "--json", str(out), *options, *bench(tmp_path, *bench_args))
    return result, (json.loads(out.read_text()) if out.exists() else None)


def invocations(tmp_path: Path, counter: int) -> int:
    """How many times the benchmark ran on the commit with this counter."""
    path = tmp_path / "runs" / f"{counter}.runs"
    return len(path.read_text()) if path.exists() else 0


def test_a_planted_8_percent_slowdown_under_noise_is_found(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(16, 11)
    result, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, "--metric", "tok_s", "--higher-is-better",
                        bench_args=("--seed", "1", "--noise", "0.02"))
    assert result.returncode == 0, result.stderr
    assert data["first_bad"]["sha"] == shas[11]
    perf = data["perf"]
    assert perf["metric"] == "tok_s" and perf["direction"] == "higher-is-better"
    assert -0.12 < perf["change"]["relative"] < -0.04  # about -8 %
    low, high = perf["change"]["ci"]
    assert low <= perf["change"]["relative"] <= high < 0
    by_sha = {entry["sha"]: entry for entry in perf["commits"]}
    # every run's sample is kept: the ends were sampled at least 5 times each, each sample the last value printed
    good_end = by_sha[shas[0]]
    assert len(good_end["samples"]) == good_end["runs"] == invocations(tmp_path, 0) >= 5
    assert all(sample > 800 for sample in good_end["samples"])  # not the early (halved) value
    assert by_sha[shas[11]]["verdict"] == "bad" and by_sha[shas[10]]["verdict"] == "good"
    # decided against the good end's pool (its runs and those of the commits like it), one-sided
    assert by_sha[shas[11]]["reason"].startswith("like the new end") and by_sha[shas[11]]["p_old"] < 0.05
    # fewer runs than a fixed 10 per tested commit
    assert data["executions"] < 10 * len(perf["commits"])
    # each step's line says what it measured, not "good" (every run that finished is, in a performance hunt)
    steps = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) == data["executions"]
    measured = re.compile(r"step \d+: [0-9a-f]{12}( \([^)]*\))? measured tok_s [\d,.]+ \(")
    assert all(measured.match(line) for line in steps), steps


def test_occasional_2x_outliers_give_the_right_commit_or_an_honest_skip(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(12, 7)
    for seed in ("3", "4"):
        result, data = hunt(cli, repo, shas[0], shas[-1], tmp_path / seed, "--metric", "tok_s",
                            "--higher-is-better", bench_args=("--seed", seed, "--noise", "0.02",
                                                              "--outliers", "0.1"))
        assert result.returncode in (0, 1), result.stderr
        if result.returncode == 0:
            assert data["first_bad"]["sha"] == shas[7]
        else:  # inconclusive: the true culprit stays among the candidates, and a skip says why
            assert shas[7] in data["candidates"]
            assert any(entry["verdict"] == "skip" and entry["reason"] for entry in data["perf"]["commits"])


def test_no_slowdown_is_exit_3_the_endpoints_do_not_differ(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(6, None)
    result, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, "--metric", "tok_s",
                        bench_args=("--seed", "2", "--noise", "0.02"))
    assert result.returncode == 3, result.stderr
    assert "the endpoints do not differ" in result.stderr
    assert data["culprit"] is None and data["outcome"] == "endpoint"


def test_a_slowdown_the_wrong_way_for_the_direction_is_exit_3(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(6, 3)
    result, _ = hunt(cli, repo, shas[0], shas[-1], tmp_path, "--metric", "latency_ms", "--higher-is-better",
                     bench_args=("--seed", "2"))
    assert result.returncode == 3
    assert "differ the wrong way for higher-is-better" in result.stderr


def test_a_speed_up_is_found_with_find_fix(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(12, 5)  # the benchmark makes "bad" commits 8 % faster here: a speed-up at 5
    result, data = hunt(cli, repo, shas[-1], shas[0], tmp_path, "--find-fix", "--metric", "latency_ms",
                        "--lower-is-better", "--jobs", "2",
                        bench_args=("--seed", "5", "--slower", "-0.08", "--file"))
    assert result.returncode == 0, result.stderr
    assert data["first_good"]["sha"] == shas[5]
    assert data["perf"]["change"]["relative"] < -0.04  # latency fell from the bad (old) end to the good one


def test_a_failing_run_makes_its_commit_a_skip_with_its_reason(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(8, 4)
    script = tmp_path / "wrap.sh"  # commit 3 crashes: no measurement there
    script.write_text(f'[ "$(cat counter.txt)" = 3 ] && exit 1\nexec {sys.executable} {BENCH} '
                      f'--runs-dir {tmp_path / "runs"} --seed 6\n')
    out = tmp_path / "out.json"
    result = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
                 str(tmp_path / "state"), "--json", str(out), "--metric", "tok_s", "--", "sh", str(script))
    data = json.loads(out.read_text())
    by_sha = {entry["sha"]: entry for entry in data["perf"]["commits"]}
    assert by_sha[shas[3]]["verdict"] == "skip"
    assert by_sha[shas[3]]["reason"] == "a run gave no measurement: bad (exit 1)"
    # as git bisect skip: the skipped commit next to the first slow one leaves both as candidates
    assert result.returncode == 1 and data["candidates"] == [shas[3], shas[4]]


def test_a_resumed_hunt_keeps_the_samples_of_the_killed_one(make_repo, tmp_path, git_env, wait_for, cli):
    repo = make_repo("r")
    shas = repo.linear(10, 6)
    argv = [sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", shas[0], "--bad",
            shas[-1], "--state-dir", str(tmp_path / "state"), "--metric", "tok_s", *bench(tmp_path, "--seed", "7")]
    hold = tmp_path / "runs" / "hold-after"
    hold.parent.mkdir()
    hold.write_text("14\n")  # the first hunt is held in its 15th run (the ends' 10 and some of a probe's stored)
    killed = subprocess.Popen(argv, env={**os.environ, **git_env, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: (hold.parent / "held").exists() or killed.poll() is not None)
        assert killed.poll() is None, "the hunt ended before its 15th run"
        os.killpg(killed.pid, signal.SIGKILL)
    finally:
        killed.wait()
    hold.unlink()
    before = invocations(tmp_path, 0)
    with sqlite3.connect(tmp_path / "state" / "bisector.sqlite") as db:
        stored = db.execute("SELECT COUNT(*) FROM executions WHERE sha = ? AND json_extract(metrics, '$.tok_s')",
                            (shas[0],)).fetchone()[0]
    out = tmp_path / "out.json"
    result = cli("run", *argv[4:argv.index("--")], "--json", str(out), *argv[argv.index("--"):])
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["resumed_from"] == 1
    good_end = next(entry for entry in data["perf"]["commits"] if entry["sha"] == shas[0])
    # every sample the killed run stored counts (a run it was killed in is lost), and the resumed run's own
    assert stored >= 5 and good_end["runs"] == len(good_end["samples"]) == stored + invocations(tmp_path, 0) - before
    assert data["first_bad"]["sha"] == shas[6]


def test_an_interrupted_hunt_reports_the_probe_it_was_sampling_as_undecided(make_repo, tmp_path, git_env, wait_for):
    """Stopped (SIGTERM) while a probe is half sampled, the hunt's reports keep that probe: its samples and
    "undecided" with why so far, in the JSON and the text (on the H200 a probe's 9 runs were missing)."""
    repo = make_repo("r")
    shas = repo.linear(10, 6)
    out = tmp_path / "out.json"
    argv = [sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", shas[0], "--bad",
            shas[-1], "--state-dir", str(tmp_path / "state"), "--metric", "tok_s", "--json", str(out),
            *bench(tmp_path, "--seed", "7")]
    hold = tmp_path / "runs" / "hold-after"
    hold.parent.mkdir()
    hold.write_text("12\n")  # held in its 13th run: the ends' 10 and two of the first probe's stored
    hunt = subprocess.Popen(argv, env={**os.environ, **git_env, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: (hold.parent / "held").exists() or hunt.poll() is not None)
        assert hunt.poll() is None, "the hunt ended before its 13th run"
        hunt.send_signal(signal.SIGTERM)
        output, _ = hunt.communicate(timeout=120)
    finally:
        if hunt.poll() is None:
            os.killpg(hunt.pid, signal.SIGKILL)
            hunt.wait()
    data = json.loads(out.read_text())
    probes = [entry for entry in data["perf"]["commits"] if entry["role"] == "probe"]
    assert len(probes) == 1 and probes[0]["verdict"] == "undecided", probes
    assert len(probes[0]["samples"]) == 2
    assert probes[0]["reason"] == "still being sampled when the hunt stopped, 2 run(s)"
    assert f"{probes[0]['sha'][:12]} undecided 2 sample(s)" in output, output


def test_metric_options_need_metric_and_exclude_flaky(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(3, 1)
    before = repo.snapshot()
    for options, message in ((("--warmup", "2"), "--warmup needs --metric NAME"),
                             (("--metric", "tok_s", "--flaky"), "--metric cannot be combined with --flaky"),
                             (("--metric", "1x"), "--metric '1x': a name of letters")):
        result = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
                     str(tmp_path / "state"), *options, "--", "true")
        assert result.returncode == 2
        assert result.stderr.startswith(f"bisector: error: {message}"), result.stderr
    assert repo.snapshot() == before


def test_a_rerun_builds_on_the_stored_samples_of_the_same_metric_only(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(8, 5)
    options = ("--metric", "tok_s", "--higher-is-better", "--reuse-verdicts")
    first, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, *options, bench_args=("--seed", "8"))
    assert first.returncode == 0 and data["first_bad"]["sha"] == shas[5], first.stderr
    measured = invocations(tmp_path, 0)
    again, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, *options, bench_args=("--seed", "8"))
    assert again.returncode == 0 and data["first_bad"]["sha"] == shas[5], again.stderr
    # every commit was decided by the samples stored: nothing ran again, and none was discarded
    assert data["executions"] == 0 and invocations(tmp_path, 0) == measured
    good_end = next(entry for entry in data["perf"]["commits"] if entry["sha"] == shas[0])
    assert good_end["runs"] == measured
    assert data["cache_key"]["perf"] == {"metric": "tok_s"}
    # another metric is another question: its samples are measured afresh
    other, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, "--metric", "latency_ms", "--lower-is-better",
                       "--reuse-verdicts", bench_args=("--seed", "8"))
    assert other.returncode == 0 and data["first_bad"]["sha"] == shas[5], other.stderr
    assert invocations(tmp_path, 0) >= measured + 6 and data["cache_key"]["perf"] == {"metric": "latency_ms"}


def test_an_end_that_reports_no_metric_stops_the_hunt_with_exit_3(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(4, 2)
    out = tmp_path / "out.json"
    result = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
                 str(tmp_path / "state"), "--json", str(out), "--metric", "tok_s", "--", "sh", "-c",
                 "echo BISECTOR_METRIC other=1")
    assert result.returncode == 3
    assert f"endpoint check failed: good {shas[0]} ({shas[0][:12]}) cannot be measured: a run reported no " \
           "tok_s (BISECTOR_METRIC tok_s=VALUE)" in result.stderr
    assert json.loads(out.read_text())["perf"]["commits"][0]["samples"] == []


def test_a_probes_runs_are_told_as_they_land_while_an_end_repeat_beside_them_still_runs(make_repo, tmp_path,
                                                                                       git_env, wait_for):
    """On the H200 the planted commit's three runs were printed only when the good end's repeat in their round
    had landed, 2 minutes later: the lines were held for --signature auto, which a performance hunt never uses
    (a failing run is a skip whatever its signature; the GPU scenario's default is auto). Here the good end's
    repeat (its 6th run) waits until the probe runs beside it have all been told."""
    repo = make_repo("r")
    shas = repo.linear(10, 6)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "hold-run").write_text("0 5\n")
    argv = [sys.executable, "-m", "bisector.cli", "run", "--repo", str(repo.path), "--good", shas[0], "--bad",
            shas[-1], "--state-dir", str(tmp_path / "state"), "--metric", "tok_s", "--jobs", "2",
            "--signature", "auto", "--json", str(tmp_path / "out.json"), *bench(tmp_path, "--seed", "7")]
    hunt = subprocess.Popen(argv, env={**os.environ, **git_env, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(hunt.stderr), daemon=True)
    reader.start()

    def told(sha: str) -> tuple[int, int]:
        """(runs of sha started, runs of sha told) so far."""
        text = list(lines)
        return (sum(line.startswith(f"  testing {sha[:12]}") for line in text),
                sum(re.match(rf"step \d+: {sha[:12]} measured", line) is not None for line in text))

    def probes_told() -> bool:
        started = [told(sha) for sha in shas[1:-1]]
        return any(count for count, _ in started) and all(count == landed for count, landed in started)

    try:
        assert wait_for(lambda: (runs / "held").exists() or hunt.poll() is not None)
        assert hunt.poll() is None, "the hunt ended before the good end's 6th run"
        assert wait_for(probes_told, 60), "".join(lines)
    finally:
        (runs / "release").touch()
        try:
            hunt.wait(timeout=120)
        finally:
            if hunt.poll() is None:
                os.killpg(hunt.pid, signal.SIGKILL)
                hunt.wait()
        reader.join(timeout=10)
    assert hunt.returncode == 0, "".join(lines)
    assert json.loads((tmp_path / "out.json").read_text())["first_bad"]["sha"] == shas[6]


def test_repeats_side_by_side_each_keep_their_own_log_and_sample(cli, make_repo, tmp_path):
    repo = make_repo("r")
    shas = repo.linear(10, 6)
    result, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, "--metric", "tok_s", "--jobs", "3",
                        bench_args=("--seed", "9"))
    assert result.returncode == 0 and data["first_bad"]["sha"] == shas[6], result.stderr
    logs = [step["log"] for step in data["steps"]]
    assert len(set(logs)) == len(logs) == data["executions"]  # repeats of one commit ran at once, each its own log
    with sqlite3.connect(tmp_path / "state" / "bisector.sqlite") as db:
        stored = db.execute("SELECT log_path, json_extract(metrics, '$.tok_s') FROM executions").fetchall()
    for log, sample in stored:  # each sample is the last value its own run printed
        printed = [line for line in Path(log).read_text().splitlines() if "tok_s=" in line]
        assert float(printed[-1].rpartition("=")[2]) == sample


def test_ends_whose_runs_overlap_stop_the_hunt_at_once_naming_the_range_left_and_keeping_the_samples(
        cli, make_repo, tmp_path):
    """The H200's VM (round 6): each run in a fast or a slow phase, 1.5x apart, half each; the slowdown 6 %.
    The ends differ, but their runs overlap: a commit like one end would need some 27 runs, and as many of
    each end, to be told apart from the other at the strict threshold, more than --max-samples 20. The hunt
    stops before any commit between the ends runs (before: up to 20 runs of each, then a skip) with exit 3
    and one line naming the range left; a run with a larger --max-samples starts from the stored samples."""
    repo = make_repo("r")
    shas = repo.linear(8, 4)
    options = ("--metric", "tok_s", "--higher-is-better")
    phases = ("--seed", "5", "--noise", "0.01", "--slower", "0.06", "--slow-phase", "0.5")
    result, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, *options, bench_args=phases)
    assert result.returncode == 3, result.stderr
    said = ("the ends' runs overlap: telling a commit apart needs about 27 runs of it and of each end, more than "
            "--max-samples {}; the first bad commit is one of the 7 from {} to {}; the samples are kept: a run "
            "with a larger --max-samples (and --reuse-verdicts, for a -- CMD) goes on from them")
    assert result.stderr.endswith(f"bisector: error: {said.format(20, shas[1][:12], shas[-1][:12])}\n")
    assert data["outcome"] == "endpoint" and data["stopped"] == said.format(20, shas[1][:12], shas[-1][:12])
    assert [invocations(tmp_path, counter) for counter in range(1, 7)] == [0] * 6  # no commit between them ran
    measured = invocations(tmp_path, 0), invocations(tmp_path, 7)
    assert min(measured) >= 5 and len(data["perf"]["commits"][0]["samples"]) == measured[0]
    again, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, *options, "--max-samples", "25", "--reuse-verdicts",
                       bench_args=phases)
    assert again.returncode == 3 and data["stopped"] == said.format(25, shas[1][:12], shas[-1][:12]), again.stderr
    assert data["executions"] == 0 and (invocations(tmp_path, 0), invocations(tmp_path, 7)) == measured


def test_a_commit_run_to_the_cap_against_overlapping_ends_stops_the_hunt_with_the_range_it_narrowed_to(
        cli, make_repo, tmp_path):
    """The same phases, another seed: the ends' runs overlap, yet by their own runs a commit could be told
    apart in fewer than 20 runs; so the commits run: the one before the slowdown is like the good end, the one
    after it like the bad end, and the first slow one ran 20 times, told apart from neither. That is the
    evidence: the hunt stops there (exit 3), naming the two commits the first bad one is among (before: it went
    on, 20 runs a commit, to a range of candidates)."""
    repo = make_repo("r")
    shas = repo.linear(8, 4)
    result, data = hunt(cli, repo, shas[0], shas[-1], tmp_path, "--metric", "tok_s", "--higher-is-better",
                        bench_args=("--seed", "4", "--noise", "0.01", "--slower", "0.06", "--slow-phase", "0.5"))
    assert result.returncode == 3, result.stderr
    assert data["stopped"] == (
        f"the ends' runs overlap: telling a commit apart needs more than --max-samples 20 runs ({shas[4][:12]} ran "
        f"20, told apart from neither end); the first bad commit is one of the 2 from {shas[4][:12]} to "
        f"{shas[5][:12]}; the samples are kept: a run with a larger --max-samples (and --reuse-verdicts, for a -- "
        f"CMD) goes on from them")
    verdicts = {entry["sha"]: (entry["verdict"], len(entry["samples"])) for entry in data["perf"]["commits"]}
    assert verdicts[shas[3]][0] == "good" and verdicts[shas[4]] == ("skip", 20) and verdicts[shas[5]][0] == "bad"
