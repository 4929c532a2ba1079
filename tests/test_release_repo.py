"""bench/release_repo.py: the release repository of the README's real hunt, built from vLLM's sdists.

Stand-in sdists (a few files shaped like vLLM's, made here) in a temporary cache, and a PyPI JSON API served
on localhost; the real sdists and the real repository are compared when both are on this machine."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "release_repo.py"
UNREACHABLE = "http://127.0.0.1:9/pypi"  # the discard port: nothing answers
TARGET = "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
MLA = ('class AiterMLAMetadataBuilder:\n    def __init__(self, kv_cache_dtype_str):\n'
       '        q_dtype = dtypes.bf16\n'
       '        if kv_cache_dtype_str in ("fp8", "fp8_e4m3", "fp8_e5m2"):\n'
       '            kv_cache_dtype_str = "fp8"\n'
       '        self.q_dtype = q_dtype\n')


def fake_sdist(version: str) -> bytes:
    """vllm-VERSION.tar.gz as an sdist lays it out: a top folder, the package, egg-info that vLLM's
    .gitignore leaves out, an executable script."""
    files = {"vllm/__init__.py": (f'__version__ = "{version}"\n', 0o644), TARGET: (MLA, 0o644),
             ".gitignore": ("*.egg-info/\n", 0o644), "vllm.egg-info/PKG-INFO": (f"Version: {version}\n", 0o644),
             "tools/check.sh": ("#!/bin/sh\nexit 0\n", 0o755)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (text, mode) in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue(), mtime=0)  # the same bytes each time


def build(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *args], capture_output=True, text=True,
                          timeout=300)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def cache(tmp_path) -> Path:
    """A sdist cache holding the stand-ins for 0.24.0, 0.25.0 and 0.25.1."""
    folder = tmp_path / "sdists"
    folder.mkdir()
    for version in ("0.24.0", "0.25.0", "0.25.1"):
        (folder / f"vllm-{version}.tar.gz").write_bytes(fake_sdist(version))
    return folder


@pytest.fixture
def index():
    """A PyPI JSON API on localhost serving stand-in sdists: index(digest=...) -> its base URL, and the paths
    asked. digest: the sha256 the index claims (None: the true one)."""
    served: dict[str, bytes] = {}
    asked: list[str] = []
    claims: dict[str, str | None] = {"digest": None}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            parts = self.path.strip("/").split("/")  # pypi/vllm/VERSION/json or files/NAME
            if parts[:2] == ["pypi", "vllm"] and len(parts) == 4:
                data = served.setdefault(parts[2], fake_sdist(parts[2]))
                name = f"vllm-{parts[2]}.tar.gz"
                body = json.dumps({"urls": [
                    {"packagetype": "bdist_wheel", "filename": f"vllm-{parts[2]}-cp38-abi3-x.whl", "url": "x",
                     "digests": {"sha256": "0"}},
                    {"packagetype": "sdist", "filename": name, "url": f"{base}/files/{name}",
                     "digests": {"sha256": claims["digest"] or hashlib.sha256(data).hexdigest()}}]}).encode()
            elif parts[0] == "files":
                body = served[parts[1].removeprefix("vllm-").removesuffix(".tar.gz")]
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    base = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def start(digest: str | None = None):
        claims["digest"] = digest
        return f"{base}/pypi", asked
    yield start
    server.shutdown()
    thread.join()


def test_releases_on_main_and_their_lines_and_the_fix_as_one_commit(cache, tmp_path):
    out = tmp_path / "rel"
    proc = build(out, "--only", "0.25,0.24", "--cache", str(cache), "--index", UNREACHABLE)  # offline: cached
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{out}\n"
    assert git(out, "for-each-ref", "--format=%(refname)").splitlines() == [
        "refs/heads/main", "refs/heads/releases/v0.24", "refs/heads/releases/v0.25",
        "refs/tags/fix-47276", "refs/tags/v0.24.0", "refs/tags/v0.25.0", "refs/tags/v0.25.1"]
    assert git(out, "log", "--format=%s", "main").splitlines() == [
        "Release v0.25.0", "[Bugfix][ROCm] Fix memory access fault in AITER MLA backend for DPA+FP8 KV (#47276)",
        "Release v0.24.0"]
    assert git(out, "rev-parse", "releases/v0.24") == git(out, "rev-parse", "v0.24.0")
    assert git(out, "log", "--format=%s", "v0.25.0..releases/v0.25").splitlines() == ["Release v0.25.1"]
    assert git(out, "rev-parse", "fix-47276^") == git(out, "rev-parse", "v0.24.0")
    assert git(out, "diff", "--numstat", "v0.24.0", "fix-47276") == f"1\t0\t{TARGET}"
    assert "+            q_dtype = dtypes.fp8\n" in git(out, "diff", "v0.24.0", "fix-47276")
    assert git(out, "show", "v0.25.1:vllm/__init__.py") == '__version__ = "0.25.1"'
    assert "vllm.egg-info" not in git(out, "ls-tree", "--name-only", "v0.25.0")  # as vLLM's .gitignore says
    assert git(out, "ls-tree", "v0.24.0", "tools/check.sh").startswith("100755 ")
    assert git(out, "status", "--porcelain") == "" and git(out, "branch", "--show-current") == "main"
    assert git(out, "log", "-1", "--format=%an <%ae> %at", "v0.24.0") == \
        "vLLM release <release@vllm.invalid> 1767312000"

    again = build(tmp_path / "again", "--only", "0.24,0.25", "--cache", str(cache), "--index", UNREACHABLE)
    assert again.returncode == 0, again.stderr
    for ref in ("main", "fix-47276", "releases/v0.25"):  # the same releases give the same commits
        assert git(tmp_path / "again", "rev-parse", ref) == git(out, "rev-parse", ref)


def test_missing_sdists_come_from_the_index_checked_and_kept(tmp_path, index):
    url, asked = index()
    cache = tmp_path / "sdists"
    proc = build(tmp_path / "rel", "--only", "0.24", "--cache", str(cache), "--index", url)
    assert proc.returncode == 0, proc.stderr
    assert asked == ["/pypi/vllm/0.24.0/json", "/files/vllm-0.24.0.tar.gz"]
    assert (cache / "vllm-0.24.0.tar.gz").read_bytes() == fake_sdist("0.24.0")
    assert git(tmp_path / "rel", "log", "--format=%s", "main").splitlines()[-1] == "Release v0.24.0"

    again = build(tmp_path / "again", "--only", "0.24", "--cache", str(cache), "--index", url)
    assert again.returncode == 0 and len(asked) == 2  # served from the cache


def test_an_sdist_that_does_not_match_its_digest_is_refused(tmp_path, index):
    url, _ = index(digest="0" * 64)
    cache = tmp_path / "sdists"
    proc = build(tmp_path / "rel", "--only", "0.24", "--cache", str(cache), "--index", url)
    assert proc.returncode == 1
    assert proc.stderr == (f"release_repo: error: vllm-0.24.0.tar.gz from {url} does not match the index's "
                           "sha256; nothing kept\n")
    assert not (tmp_path / "rel").exists() and not cache.exists()


@pytest.mark.parametrize("args, code, message", [
    (["--only", "0.24,0.9"], 2, "unknown release line(s) 0.9; known: 0.10, "),
    (["--only", "0.24,0.25,0.27"], 1, "cannot download vllm-0.27.0.tar.gz from http://127.0.0.1:9/pypi into "),
])
def test_bad_input_and_an_unreachable_index_create_nothing(cache, tmp_path, args, code, message):
    proc = build(tmp_path / "rel", *args, "--cache", str(cache), "--index", UNREACHABLE)
    assert proc.returncode == code
    assert proc.stderr.startswith(f"release_repo: error: {message}") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "rel").exists()


def test_an_existing_output_is_left_alone(cache, tmp_path):
    out = tmp_path / "rel"
    out.mkdir()
    (out / "mine").write_text("x\n")
    proc = build(out, "--only", "0.24", "--cache", str(cache), "--index", UNREACHABLE)
    assert proc.returncode == 2
    assert proc.stderr == f"release_repo: error: {out} exists; give a path that does not\n"
    assert [entry.name for entry in out.iterdir()] == ["mine"]


RELEASES = Path(os.environ.get("BISECTOR_RELEASE_REPO", "/work/vllm-rel"))
SDISTS = Path(os.environ.get("VLLM_SDIST_CACHE", Path.home() / ".cache" / "vllm-sdists"))


@pytest.mark.slow
@pytest.mark.skipif(not (RELEASES / ".git").exists() or not (SDISTS / "vllm-0.25.1.tar.gz").exists(),
                    reason="needs the release repository (BISECTOR_RELEASE_REPO) and its sdists cached "
                           "(VLLM_SDIST_CACHE)")
def test_the_real_sdists_give_the_release_repositorys_trees(tmp_path):
    """Built offline from the cached sdists, v0.24.0, the fix and the 0.25 line have the release repository's
    trees (the whole 0.18-0.25 build, 8 minutes here, gave every one of its refs, commit ids included)."""
    out = tmp_path / "rel"
    proc = build(out, "--only", "0.24,0.25", "--cache", str(SDISTS), "--index", UNREACHABLE)
    if proc.returncode == 1 and "cannot download" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    refs = ["v0.24.0", "fix-47276", "v0.25.0", "releases/v0.25"]
    assert [git(out, "rev-parse", f"{ref}^{{tree}}") for ref in refs] == \
        [git(RELEASES, "rev-parse", f"{ref}^{{tree}}") for ref in refs]
