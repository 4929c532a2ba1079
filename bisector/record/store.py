"""SQLite record of runs, steps and every scenario execution (the verdict cache).

Every text a row keeps (params and command lines, results and stop reasons, reasons, details, marks, key parts)
is redacted as it is written (bisector.redact): no credential reaches the record, whatever its callers pass."""
from __future__ import annotations

import functools
import json
import os
import resource
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from bisector.errors import EXIT_RECORD, BisectorError
from bisector.redact import redact, redact_json
from bisector.seams import Verdict

SCHEMA_VERSION = 6  # PRAGMA user_version of the files this bisector writes

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,               -- bisect | backport
    key TEXT NOT NULL,                -- fingerprint of what was asked: same command, same key
    status TEXT NOT NULL,             -- running | finished | failed | interrupted
    pid INTEGER,
    created REAL NOT NULL,
    finished REAL,
    params TEXT NOT NULL,             -- JSON
    result TEXT,                      -- JSON, when finished
    resumed_from INTEGER              -- the unfinished run (same key) this one resumed
);
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY,
    sha TEXT NOT NULL,
    scenario_key TEXT NOT NULL,       -- name/version/options fingerprint
    verdict TEXT NOT NULL,
    reason TEXT NOT NULL,
    log_path TEXT,
    seconds REAL NOT NULL,
    build TEXT,
    details TEXT,                     -- JSON: what a human reads of the run (the engine reads none of it)
    recorded REAL NOT NULL,
    run_id INTEGER,                   -- the run that recorded it (NULL: a single judged commit)
    signature TEXT,                   -- the failure signature its scenario gave (NULL: none given)
    timed_out_after REAL,             -- the timeout it hit (NULL: it did not time out)
    image_digest TEXT,                -- the digest of the --image it ran in (NULL: no image)
    metrics TEXT                      -- JSON {name: value}: what the run measured (NULL: nothing)
);
CREATE INDEX IF NOT EXISTS executions_by_commit ON executions (sha, scenario_key);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    round INTEGER NOT NULL,
    sha TEXT NOT NULL,
    role TEXT NOT NULL,               -- endpoint | probe | ...
    verdict TEXT NOT NULL,
    reason TEXT NOT NULL,
    log_path TEXT,
    seconds REAL NOT NULL,
    cached INTEGER NOT NULL,
    build TEXT,
    recorded REAL NOT NULL,
    cause TEXT                        -- why it is no verdict about the commit (CAUSES), NULL: a verdict
);
CREATE INDEX IF NOT EXISTS steps_by_run ON steps (run_id, seq);
CREATE TABLE IF NOT EXISTS cache_keys (
    key TEXT PRIMARY KEY,             -- executions.scenario_key
    parts TEXT NOT NULL               -- JSON: what the key hashes (scenario identity, build strategy)
);
CREATE TABLE IF NOT EXISTS builds (
    native_hash TEXT PRIMARY KEY,     -- native input trees + toolchain
    status TEXT NOT NULL,             -- ok | failed
    strategy TEXT NOT NULL,           -- source | precompiled
    log_path TEXT,
    artifact_dir TEXT,                -- <state_dir>/artifacts/<hash>, when ok
    files TEXT NOT NULL,              -- JSON list of paths relative to the worktree
    size INTEGER NOT NULL,
    last_used REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS marks (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id), -- the run it was given to: evidence for it and its resumptions only
    sha TEXT NOT NULL,
    verdict TEXT NOT NULL,            -- good | bad | skip, given by hand (bisector mark)
    reason TEXT NOT NULL,             -- the user's --reason, '' when none
    recorded REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS marks_by_run ON marks (run_id, id);
CREATE TABLE IF NOT EXISTS images (
    ref TEXT PRIMARY KEY,             -- an --image template filled in for one commit
    present INTEGER NOT NULL,         -- 1: the image exists (here or in its registry), 0: a miss (asked again later)
    info TEXT NOT NULL,               -- JSON: bisector.world.images.ImageInfo
    checked REAL NOT NULL,
    pulled INTEGER NOT NULL DEFAULT 0, -- 1: this tool pulled it, so it may remove it (--image-cache-size)
    size INTEGER,
    last_used REAL
);
"""


def _add_columns(db: sqlite3.Connection, *columns: tuple[str, str]) -> None:
    for table, column in columns:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")


def _forget_machine_skips(db: sqlite3.Connection) -> None:
    """Version 3 keeps no machine-caused skip: drop those an earlier bisector cached (its machine_check's,
    marked machine_unfit) and give steps their cause."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'steps'").fetchone():
        _add_columns(db, ("steps", "cause TEXT"))  # else SCHEMA creates it with the column
    db.execute("DELETE FROM executions WHERE json_extract(details, '$.machine_unfit')")


def _typed_controls(db: sqlite3.Connection) -> None:
    """Version 4 keeps what the engine reads of an execution in columns: read them out of each older row's
    details once (the details stay as they were, for humans)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'executions'").fetchone():
        return  # SCHEMA creates it with the columns
    _add_columns(db, ("executions", "signature TEXT"), ("executions", "timed_out_after REAL"),
                 ("executions", "image_digest TEXT"))
    db.execute("UPDATE executions SET signature = json_extract(details, '$.signature'), "
               "timed_out_after = json_extract(details, '$.timed_out_after'), "
               "image_digest = json_extract(details, '$.image.digest') WHERE json_valid(details)")


def _metrics_column(db: sqlite3.Connection) -> None:
    """Version 6 keeps what each execution measured (a performance hunt's samples) in a column."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(executions)")}
    if columns and "metrics" not in columns:  # no table: SCHEMA creates it with the column
        _add_columns(db, ("executions", "metrics TEXT"))


# How a file of schema version N becomes version N + 1 (0: files written before versions were kept).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    0: lambda db: None,  # same tables as version 1
    1: lambda db: _add_columns(db, ("runs", "resumed_from INTEGER"), ("executions", "run_id INTEGER")),
    2: _forget_machine_skips,
    3: _typed_controls,
    4: lambda db: None,  # 5 adds the marks table (SCHEMA creates it)
    5: _metrics_column,
}
# Why a skip is no verdict about the commit (Execution.cause), in words: such an execution is never stored in
# executions, so never served from the cache; the run that saw it shows it as a step.
CAUSES = {
    "build": "the build failed",
    "env": "the commit's environment could not be created",
    "world": "the world it stands on failed (its image, its AITER install, its checkout)",
    "machine": "the machine, not the commit",
    "external-signal": "killed from outside, not the commit",
}


class StoreError(BisectorError):
    """The record file cannot be used (corrupt, read-only, disk full, newer schema): not the user's input,
    so not a usage error; verdicts recorded before it are kept."""

    exit_code = EXIT_RECORD


ROOM_MARGIN = 1 << 20  # bytes: less room than this for the record's files counts as none


def _advice(exc: sqlite3.Error, path: Path) -> str:
    text = str(exc).lower()
    if "readonly" in text or "unable to open" in text or "access permission" in text:
        return "it cannot be written: fix its permissions or give another --state-dir"
    if "full" in text or "disk i/o error" in text:  # SQLite names no errno: the machine says which
        why = _no_room(path) or ("the disk is full: free space" if "full" in text else None)
        if why:
            return f"{why} and run the same command again (the record is kept, verdicts so far too)"
        return "a write to it failed (the disk, a quota?): fix that and run the same command again (the record is kept)"
    if "locked" in text or "busy" in text:
        return "another process holds it locked: wait for it, then run again"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return "it is corrupt: move it aside (its cached verdicts are lost) and run again"
    return "move it aside or give another --state-dir"


def _no_room(path: Path) -> str | None:
    """Why the record's files cannot grow, and what to do, when they cannot: a file size limit (`ulimit -f`) they
    reach, or a full disk."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    files = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")]
    largest = max((file.stat().st_size for file in files if file.exists()), default=0)
    if limit != resource.RLIM_INFINITY and largest + ROOM_MARGIN > limit:
        return f"a file size limit was hit (ulimit -f: {limit} bytes): raise it"
    try:
        disk = os.statvfs(path.parent)
    except OSError:
        return None
    return "the disk is full: free space" if disk.f_bavail * disk.f_frsize < ROOM_MARGIN else None


def _guarded(method):
    """Turn an SQLite failure inside a Store method into one StoreError line naming the file."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise StoreError(f"bisector record {self.path}: {exc}; {_advice(exc, self.path)}") from None
    return call


@dataclass
class RunRecord:
    """A run being recorded: set `result` when it finishes; leaving without one marks it failed."""

    id: int
    resumed_from: int | None
    result: dict | None = None


@dataclass(frozen=True)
class Execution:
    """One scenario run on one commit (or a step's decided verdict); stored with its verdict's value.

    `details` is what a human reads of it (reports show it); what the engine decides on is typed.
    """

    sha: str
    verdict: Verdict
    reason: str
    log_path: str | None
    seconds: float
    build: str | None
    details: dict
    run_id: int | None = None  # the run that recorded it, once stored
    cause: str | None = None  # why it is no verdict about the commit (CAUSES): never stored; None: a verdict
    signature: str | None = None  # the failure signature its scenario gave (engine.judge.signature_of)
    timed_out_after: float | None = None  # the timeout it hit: counts only while the timeout is not larger
    image_digest: str | None = None  # the --image it ran in: part of its verdict cache key
    manual: bool = False  # a verdict given by hand (bisector mark): no scenario ran
    different_failure: bool = False  # a bad run judged skip: its signature is not the fault hunted
    clean_runs: tuple[Execution, ...] = ()  # the good runs a repeated good verdict sums (--repeat N)
    metrics: dict[str, float] = field(default_factory=dict)  # what the run measured (bisector.metrics)

    @property
    def is_verdict(self) -> bool:
        """Whether it judged the commit (and is kept in the verdict cache)."""
        return self.cause is None

    @property
    def masked(self) -> str | None:
        """What hides the bug on a good run, when its scenario says so (Outcome.masked, kept in details)."""
        masked = self.details.get("masked") if self.verdict is Verdict.GOOD else None
        return str(masked) if masked else None


@dataclass(frozen=True)
class BuildRecord:
    native_hash: str
    status: str
    strategy: str
    log_path: str | None
    artifact_dir: str | None
    files: tuple[str, ...]
    size: int
    last_used: float


class Store:
    """One SQLite file per state dir. Every write commits at once: a kill -9 loses nothing."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.db = self._open()

    @_guarded
    def _open(self) -> sqlite3.Connection:
        """The file's connection, its schema created or migrated to SCHEMA_VERSION."""
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA busy_timeout = 30000")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            db.close()
            raise StoreError(f"bisector record {self.path} has schema version {version}; this bisector reads "
                             f"up to {SCHEMA_VERSION}: upgrade bisector or give another --state-dir")
        db.execute("BEGIN IMMEDIATE")
        try:
            tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
            if tables:
                for step in range(version, SCHEMA_VERSION):
                    MIGRATIONS[step](db)
            for statement in filter(str.strip, SCHEMA.split(";")):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return db

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs ------------------------------------------------------------------------------------
    @_guarded
    def start_run(self, kind: str, key: str, params: dict, pid: int) -> tuple[int, int | None]:
        """A new run row; returns (run id, id of the run with the same key it resumes: one unfinished, or one
        stopped that holds verdicts given by hand)."""
        resumed = self.resumable(key)
        row = self.run(resumed) if resumed is not None else None
        if row is not None and row["status"] == "running":
            self.db.execute("UPDATE runs SET status = 'interrupted' WHERE id = ?", (resumed,))
        cur = self.db.execute("INSERT INTO runs (kind, key, status, pid, created, params, resumed_from) "
                              "VALUES (?, ?, 'running', ?, ?, ?, ?)",
                              (kind, key, pid, time.time(), _json(params), resumed))
        return cur.lastrowid, resumed

    @_guarded
    def resumable(self, key: str) -> int | None:
        """The run a new run of key resumes: the last of key when unfinished (killed, or Ctrl-C), or stopped
        holding verdicts given by hand; else None."""
        row = self.db.execute("SELECT id, status FROM runs WHERE key = ? ORDER BY id DESC LIMIT 1", (key,)).fetchone()
        resumable = row is not None and (row["status"] in ("running", "interrupted")  # killed, or Ctrl-C
                                         or row["status"] == "failed" and bool(self.marks(self.lineage(row["id"]))))
        return row["id"] if resumable else None

    @contextmanager
    def recording(self, kind: str, key: str, params: dict) -> Iterator[RunRecord]:
        """Start a run row and close it on the way out: finished, failed or interrupted (Ctrl-C)."""
        run_id, resumed = self.start_run(kind, key, params, os.getpid())
        record = RunRecord(run_id, resumed)
        status = "failed"
        try:
            yield record
            if record.result is not None:
                status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.finish_run(run_id, status, record.result)

    @_guarded
    def finish_run(self, run_id: int, status: str, result: dict | None) -> None:
        self.db.execute("UPDATE runs SET status = ?, finished = ?, result = ? WHERE id = ?",
                        (status, time.time(), _json(result) if result is not None else None, run_id))

    @_guarded
    def update_result(self, run_id: int, result: dict) -> None:
        """Replace a finished run's result (--follow-pins adds the levels that followed it)."""
        self.db.execute("UPDATE runs SET result = ? WHERE id = ?", (_json(result), run_id))

    @_guarded
    def run(self, run_id: int | str) -> sqlite3.Row | None:
        if run_id == "latest":
            return self.db.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        return self.db.execute("SELECT * FROM runs WHERE id = ?", (int(run_id),)).fetchone()

    @_guarded
    def lineage(self, run_id: int) -> tuple[int, ...]:
        """run_id and the unfinished runs it resumed, each resuming the one before (newest first)."""
        chain = [run_id]
        while True:
            row = self.db.execute("SELECT resumed_from FROM runs WHERE id = ?", (chain[-1],)).fetchone()
            if row is None or row["resumed_from"] is None or row["resumed_from"] in chain:
                return tuple(chain)
            chain.append(row["resumed_from"])

    @_guarded
    def runs(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM runs ORDER BY id").fetchall()

    def latest(self, repo: str | None = None, scenario: str | None = None,
               ended: bool = True) -> sqlite3.Row | None:
        """The last run that ended (whatever its outcome: finished, failed, interrupted; with ended=False any
        run, one still running too), of repository repo (its root path) and scenario name when given."""
        status = "WHERE status != 'running' " if ended else ""
        for row in reversed(self.db.execute(f"SELECT * FROM runs {status}ORDER BY id").fetchall()):
            params = json.loads(row["params"])
            if repo is not None and params.get("repo") != repo:
                continue
            if scenario is not None and run_scenario_name(params) != scenario:
                continue
            return row
        return None

    # -- executions (the verdict cache) ----------------------------------------------------------
    @_guarded
    def executions(self, sha: str, scenario_key: str, after_id: int = 0,
                   runs: tuple[int, ...] | None = None) -> list[Execution]:
        """sha's executions under scenario_key, oldest first; only those after execution after_id, and
        when runs is given only those these runs recorded."""
        only = "" if runs is None else f" AND run_id IN ({', '.join('?' * len(runs))})"
        rows = self.db.execute(f"SELECT * FROM executions WHERE sha = ? AND scenario_key = ? AND id > ?{only} "
                               "ORDER BY id", (sha, scenario_key, after_id, *(runs or ()))).fetchall()
        return [Execution(r["sha"], Verdict(r["verdict"]), r["reason"], r["log_path"], r["seconds"], r["build"],
                          json.loads(r["details"] or "{}"), r["run_id"], signature=r["signature"],
                          timed_out_after=r["timed_out_after"], image_digest=r["image_digest"],
                          metrics=json.loads(r["metrics"] or "{}")) for r in rows]

    @_guarded
    def add_execution(self, scenario_key: str, execution: Execution, run_id: int | None = None) -> None:
        """Store execution under scenario_key, as recorded by run run_id (None: no run row); an execution
        that is no verdict (a cause) is refused."""
        if not execution.is_verdict:
            raise ValueError(f"not a verdict about the commit ({execution.cause}): not stored")
        self.db.execute("INSERT INTO executions (sha, scenario_key, verdict, reason, log_path, seconds, "
                        "build, details, recorded, run_id, signature, timed_out_after, image_digest, metrics) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (execution.sha, scenario_key, execution.verdict.value, redact(execution.reason),
                         execution.log_path, execution.seconds, _text(execution.build),
                         _json(execution.details), time.time(), run_id, _text(execution.signature),
                         execution.timed_out_after, execution.image_digest,
                         json.dumps(execution.metrics) if execution.metrics else None))

    def last_execution_id(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0]

    def remember_key(self, key: str, parts: dict) -> None:
        """Keep what a verdict cache key stands for, for `bisector cache list`."""
        self.db.execute("INSERT OR REPLACE INTO cache_keys (key, parts) VALUES (?, ?)",
                        (key, json.dumps(redact_json(parts), sort_keys=True, default=str)))

    def step_seconds(self, scenario: str, latest: int = 50) -> list[float]:
        """How long the latest executions of scenario (its name, any options) ran, newest first."""
        return [row[0] for row in self.db.execute(
            "SELECT seconds FROM executions WHERE substr(scenario_key, 1, length(?) + 1) = ? || '/' "
            "ORDER BY id DESC LIMIT ?", (scenario, scenario, latest))]

    def cached_verdicts(self, sha_prefix: str = "", scenario: str | None = None) -> list[sqlite3.Row]:
        """Per (commit, key): executions, verdicts seen, last recorded, the key's parts; filtered by a
        commit sha prefix and a scenario name."""
        return self.db.execute(
            "SELECT e.sha, e.scenario_key, COUNT(*) AS runs, GROUP_CONCAT(DISTINCT e.verdict) AS verdicts, "
            "MAX(e.recorded) AS recorded, k.parts FROM executions e LEFT JOIN cache_keys k "
            "ON k.key = e.scenario_key WHERE substr(e.sha, 1, length(?)) = ? AND (? IS NULL OR "
            "substr(e.scenario_key, 1, length(?) + 1) = ? || '/') GROUP BY e.sha, e.scenario_key ORDER BY recorded",
            (sha_prefix, sha_prefix, scenario, scenario, scenario)).fetchall()

    def forget_verdicts(self, sha_prefix: str = "", scenario: str | None = None) -> int:
        """Delete the executions matching (as cached_verdicts); returns how many."""
        cur = self.db.execute("DELETE FROM executions WHERE substr(sha, 1, length(?)) = ? AND (? IS NULL OR "
                              "substr(scenario_key, 1, length(?) + 1) = ? || '/')",
                              (sha_prefix, sha_prefix, scenario, scenario, scenario))
        return cur.rowcount

    # -- marks (verdicts given by hand: bisector mark) ----------------------------------------------
    @_guarded
    def add_mark(self, run_id: int, sha: str, verdict: Verdict, reason: str = "") -> None:
        """Record sha's verdict, given by hand to run run_id (a later mark of the same commit replaces it)."""
        self.db.execute("INSERT INTO marks (run_id, sha, verdict, reason, recorded) VALUES (?, ?, ?, ?, ?)",
                        (run_id, sha, verdict.value, redact(reason), time.time()))

    @_guarded
    def marks(self, runs: tuple[int, ...]) -> dict[str, Execution]:
        """The verdicts given by hand to these runs (a run and those it resumes), as executions by commit;
        the newest mark of a commit wins. Never served to any other run."""
        if not runs:
            return {}
        rows = self.db.execute(f"SELECT * FROM marks WHERE run_id IN ({', '.join('?' * len(runs))}) ORDER BY id",
                               runs).fetchall()
        return {row["sha"]: Execution(row["sha"], Verdict(row["verdict"]), "marked by hand"
                                      + (f": {row['reason']}" if row["reason"] else ""), None, 0.0, None,
                                      {"manual": True, "marked": row["recorded"]}, row["run_id"], manual=True)
                for row in rows}

    # -- steps -----------------------------------------------------------------------------------
    @_guarded
    def add_step(self, run_id: int, seq: int, round_no: int, role: str, execution: Execution,
                 cached: bool) -> None:
        self.db.execute("INSERT INTO steps (run_id, seq, round, sha, role, verdict, reason, log_path, "
                        "seconds, cached, build, recorded, cause) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (run_id, seq, round_no, execution.sha, role, execution.verdict.value,
                         redact(execution.reason), execution.log_path, execution.seconds, int(cached),
                         _text(execution.build), time.time(),
                         execution.cause))

    @_guarded
    def steps(self, run_id: int) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM steps WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()

    # -- builds (the artifact cache index) -------------------------------------------------------
    @_guarded
    def builds(self) -> list[BuildRecord]:
        rows = self.db.execute("SELECT * FROM builds ORDER BY last_used").fetchall()
        return [BuildRecord(r["native_hash"], r["status"], r["strategy"], r["log_path"], r["artifact_dir"],
                            tuple(json.loads(r["files"])), r["size"], r["last_used"]) for r in rows]

    @_guarded
    def put_build(self, record: BuildRecord) -> None:
        self.db.execute("INSERT OR REPLACE INTO builds (native_hash, status, strategy, log_path, "
                        "artifact_dir, files, size, last_used) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (record.native_hash, record.status, record.strategy, record.log_path,
                         record.artifact_dir, json.dumps(list(record.files)), record.size,
                         record.last_used))

    @_guarded
    def touch_build(self, native_hash: str, when: float) -> None:
        self.db.execute("UPDATE builds SET last_used = ? WHERE native_hash = ?", (when, native_hash))

    @_guarded
    def delete_build(self, native_hash: str) -> None:
        self.db.execute("DELETE FROM builds WHERE native_hash = ?", (native_hash,))


    # -- images (bisector.world.images: availability answers, and what this tool pulled) ----------------------
    @_guarded
    def images(self, refs: list[str]) -> dict[str, dict]:
        """Stored answers for refs: {ref: {"present", "info", "checked"}}."""
        found = {}
        for chunk in (refs[i:i + 500] for i in range(0, len(refs), 500)):
            marks = ",".join("?" * len(chunk))
            for row in self.db.execute(f"SELECT * FROM images WHERE ref IN ({marks})", chunk):
                found[row["ref"]] = {"present": bool(row["present"]), "info": json.loads(row["info"]),
                                     "checked": row["checked"]}
        return found

    @_guarded
    def put_image(self, ref: str, present: bool, info: dict, pulled: bool = False) -> None:
        """An availability answer (a pull marks the image as this tool's, to remove when over the cap)."""
        now = time.time()
        self.db.execute("INSERT INTO images (ref, present, info, checked, pulled, size, last_used) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(ref) DO UPDATE SET present = excluded.present, "
                        "info = excluded.info, checked = excluded.checked, "
                        "pulled = MAX(images.pulled, excluded.pulled), size = COALESCE(excluded.size, images.size), "
                        "last_used = COALESCE(excluded.last_used, images.last_used)",
                        (ref, int(present), _json(info), now, int(pulled), info.get("size"),
                         now if pulled else None))

    @_guarded
    def touch_image(self, ref: str, when: float) -> None:
        self.db.execute("UPDATE images SET last_used = ? WHERE ref = ?", (when, ref))

    @_guarded
    def pulled_images(self) -> list[sqlite3.Row]:
        """Images this tool pulled and has not removed, least recently used first."""
        return self.db.execute("SELECT * FROM images WHERE pulled = 1 ORDER BY COALESCE(last_used, 0), ref").fetchall()

    @_guarded
    def forget_pulled(self, ref: str) -> None:
        """ref was removed from this machine: no longer this tool's, not known to be here."""
        self.db.execute("UPDATE images SET pulled = 0 WHERE ref = ?", (ref,))


def _json(value) -> str:
    """value as the JSON a row keeps, every string in it redacted."""
    return json.dumps(redact_json(value))


def _text(value: str | None) -> str | None:
    """value as a row keeps it, redacted (None stays None)."""
    return None if value is None else redact(value)


def run_scenario_name(params: dict) -> str:
    """The scenario name a run's params name (older records: the first part of its key)."""
    return params.get("scenario_name") or str(params.get("scenario") or "").split("/")[0]
