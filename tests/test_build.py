"""Build strategies on a stand-in for vLLM: a repo whose `setup.py develop` really compiles a C extension."""
import functools
import http.server
import json
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from bisector import builds
from bisector.builds import BuildSettings, parse_size
from bisector.builds.artifacts import ArtifactCache
from bisector.builds.base import BuildResult, Decision
from bisector.builds.native import Toolchain, native_hash
from bisector.builds.precompiled import precompiled_plan
from bisector.builds.source import compiler_cache_env, source_plan
from bisector.repo.refs import GitRepo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIXTURE_SETUP = '''\
import io, os, urllib.request, zipfile
from setuptools import Extension, setup

location = os.environ.get("VLLM_PRECOMPILED_WHEEL_LOCATION")
ext_modules = [Extension("fixturepkg._C", ["csrc/native.c"])]
if os.environ.get("VLLM_USE_PRECOMPILED") == "1" and location:
    data = urllib.request.urlopen(location).read() if "://" in location else open(location, "rb").read()
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        for name in wheel.namelist():
            if name.endswith(".so"):
                with open(name, "wb") as out:
                    out.write(wheel.read(name))
    ext_modules = []
setup(name="fixturepkg", version="0", packages=["fixturepkg"], ext_modules=ext_modules)
'''
NATIVE_C = '''\
#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_C", 0, -1, 0};
PyMODINIT_FUNC PyInit__C(void) {
    PyObject *mod = PyModule_Create(&m);
    PyModule_AddIntConstant(mod, "NATIVE_VERSION", %d);
    return mod;
}
'''
# Exit 3 if the extension loaded is not the one this commit's Python expects (a stale or missing .so).
CHECK = '''\
import sys
import fixturepkg
from fixturepkg import _C
print("native", _C.NATIVE_VERSION, "expected", fixturepkg.EXPECTED_NATIVE, "file", _C.__file__)
if _C.NATIVE_VERSION != fixturepkg.EXPECTED_NATIVE:
    sys.exit(3)
sys.exit(1 if fixturepkg.BAD else 0)
'''


def package(native: int, bad: bool, counter: int) -> str:
    return f"EXPECTED_NATIVE = {native}\nBAD = {bad}\nCOUNTER = {counter}\n"


@pytest.fixture(scope="session")
def venv_python(tmp_path_factory) -> str:
    """A throwaway environment for `setup.py develop` (it registers the package there)."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True)
    return str(path / "bin" / "python")


def stand_in(repo, count: int, native_at: set[int], bad_from: int, broken: set[int] = frozenset(),
             build_reqs: str = "requirements/build/rocm.txt") -> list[str]:
    """count commits; commit i changes csrc when i in native_at (i=0 always), else only Python."""
    shas, native = [], 0
    for i in range(count):
        files = {"fixturepkg/__init__.py": package(native if i not in native_at else i, i >= bad_from, i)}
        if i == 0:
            files.update({"setup.py": FIXTURE_SETUP, "check.py": CHECK, build_reqs: "setuptools\n",
                          "vllm/__init__.py": "",  # `--build auto` builds only trees it knows as vLLM
                          ".gitignore": "build/\n*.so\n*.egg-info/\n"})
        if i in native_at or i == 0:
            native = i
            files["csrc/native.c"] = NATIVE_C % i + ("syntax error here\n" if i in broken else "")
            files["fixturepkg/__init__.py"] = package(native, i >= bad_from, i)
        shas.append(repo.commit(f"change {i} (#{2000 + i})", files))
    return shas


@pytest.fixture
def run_auto(cli):
    def run(repo, shas, python, state_dir, *extra):
        return cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
                   "--state-dir", str(state_dir), "--python", python, "--json", str(state_dir.with_name("r.json")),
                   "--build", "auto", "--allow-install-into-python", *extra, "--", python, "check.py",
                   env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"})

    return run


def gcc_runs(state_dir: Path) -> int:
    """Build logs in which the system compiler really ran."""
    return sum("gcc" in log.read_text() for log in (state_dir / "logs").rglob("build-*-develop.log"))


def test_auto_compiles_once_per_native_hash_and_reuses_artifacts(make_repo, venv_python, tmp_path, cli,
                                                                 run_auto):
    repo = make_repo()
    shas = stand_in(repo, 40, native_at={6, 7, 25}, bad_from=17)
    before = repo.snapshot()
    state = tmp_path / "state"
    proc = run_auto(repo, shas, venv_python, state)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(state.with_name("r.json").read_text())
    assert result["first_bad"]["sha"] == shas[17]
    builds = [s["build"].split(":")[0] for s in result["steps"]]
    # a step compiles, or finds its native compiled ahead of it (--build-ahead, logs under logs/run-N/ahead/)
    compiles = builds.count("source") + len(list(state.glob("logs/*/ahead/build-*-develop.log")))
    assert compiles == gcc_runs(state) >= 2
    assert builds.count("reuse") >= 1 and builds.count("source") < len(builds)
    # every step ran check.py, which exits 3 on a stale or missing extension: all loaded the right one
    assert all(s["verdict"] in ("good", "bad") for s in result["steps"])
    assert all(not s["reason"].startswith("exit 3") for s in result["steps"])
    # at most one compile per distinct native hash (4 exist: commits 0-5, 6, 7-24, 25-39)
    assert compiles <= 4
    artifacts = sorted(p.name for p in (state / "artifacts").iterdir())
    assert len(artifacts) == compiles
    assert repo.snapshot() == before

    # a second bisection of another range reuses every artifact: no compile at all
    again = cli("run", "--repo", str(repo.path), "--good", shas[1], "--bad", shas[30],
                "--state-dir", str(state), "--python", venv_python, "--json", str(tmp_path / "2.json"),
                "--build", "auto", "--", venv_python, "check.py")
    assert again.returncode == 0, again.stderr
    second = json.loads((tmp_path / "2.json").read_text())
    assert second["first_bad"]["sha"] == shas[17]
    fresh = [s["build"] for s in second["steps"] if not s["cached"]]
    assert fresh and all(b.startswith("reuse:") for b in fresh), fresh
    assert gcc_runs(state) == compiles


def test_failed_build_is_remembered_with_its_log(make_repo, venv_python, tmp_path):
    repo = make_repo()
    shas = stand_in(repo, 6, native_at={2}, bad_from=5, broken={2})
    state = tmp_path / "state"
    builder = BuildSettings("auto", venv_python, install_into_python=True).open(GitRepo(repo.path), state)
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", shas[2]], check=True)
    first = builder.prepare(work, shas[2], state / "logs")
    assert not first.ok and first.strategy == "source"
    assert "error" in Path(first.log_path).read_text()
    # a Python-only child has the same native hash: skipped at once, pointing at the original log
    builder = BuildSettings("auto", venv_python, install_into_python=True).open(GitRepo(repo.path), state)
    second = builder.prepare(work, shas[3], state / "logs")
    assert not second.ok and "failed to build before" in second.reason
    assert second.log_path == first.log_path
    assert builder.cost(shas[3]) > builder.cost(shas[0])


def test_stale_extension_from_another_native_hash_is_never_used(make_repo, venv_python, tmp_path):
    repo = make_repo()
    shas = stand_in(repo, 3, native_at={1}, bad_from=9)
    state = tmp_path / "state"
    builder = BuildSettings("python", venv_python).open(GitRepo(repo.path), state)
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", shas[0]], check=True)
    assert BuildSettings("source", venv_python, install_into_python=True).open(GitRepo(repo.path), state) \
        .prepare(work, shas[0], state / "logs").ok
    stale = list((work / "fixturepkg").glob("_C*.so"))
    assert stale
    subprocess.run(["git", "-C", str(work), "checkout", "-q", shas[1]], check=True)
    result = builder.prepare(work, shas[1], state / "logs")  # --build python, hash never built
    assert not result.ok and "never built" in result.reason
    assert not list((work / "fixturepkg").glob("_C*.so"))


def make_wheels(repo, shas, python, tmp_path) -> Path:
    """Wheels (zips holding the compiled extension) for each of shas, one compile per distinct csrc."""
    wheels, built = tmp_path / "wheels", {}
    for sha in shas:
        source = subprocess.run(["git", "-C", str(repo.path), "show", f"{sha}:csrc/native.c"],
                                check=True, capture_output=True, text=True).stdout
        if source not in built:
            work = tmp_path / f"wheel-src-{sha[:8]}"
            subprocess.run(["git", "clone", "-q", str(repo.path), str(work)], check=True)
            subprocess.run(["git", "-C", str(work), "checkout", "-q", sha], check=True)
            subprocess.run([python, "setup.py", "build_ext", "--inplace"], cwd=work, check=True,
                           capture_output=True)
            built[source] = list((work / "fixturepkg").glob("*.so"))
        (wheels / sha).mkdir(parents=True)
        with zipfile.ZipFile(wheels / sha / "fixturepkg-0-cp311-abi3-linux_x86_64.whl", "w") as wheel:
            for so in built[source]:
                wheel.write(so, f"fixturepkg/{so.name}")
    return wheels


@pytest.mark.parametrize("served", [False, True], ids=["dir", "url"])
def test_precompiled_wheels_replace_compiles(make_repo, venv_python, tmp_path, served, run_auto):
    repo = make_repo()
    shas = stand_in(repo, 16, native_at={3, 12}, bad_from=9)
    wheels = make_wheels(repo, shas, venv_python, tmp_path)
    spec = str(wheels)
    if served:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wheels))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        spec = f"http://127.0.0.1:{server.server_address[1]}/{{commit}}/"
    state = tmp_path / "state"
    try:
        proc = run_auto(repo, shas, venv_python, state, "--wheels", spec)
    finally:
        if served:
            server.shutdown()
    assert proc.returncode == 0, proc.stderr
    result = json.loads(state.with_name("r.json").read_text())
    assert result["first_bad"]["sha"] == shas[9]
    builds = [s["build"].split(":")[0] for s in result["steps"]]
    assert "source" not in builds and "precompiled" in builds
    assert gcc_runs(state) == 0
    assert all(s["verdict"] in ("good", "bad") for s in result["steps"])


def test_plan_shows_rocm_build_commands_and_runs_nothing(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = stand_in(repo, 12, native_at={5}, bad_from=8, build_reqs="requirements/rocm-build.txt")
    before = repo.snapshot()
    state = tmp_path / "state"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--plan",
               "--build", "auto", "--rocm-arch", "gfx950", "--state-dir", str(state),
               "--json", str(tmp_path / "plan.json"),
               "--", "true", env={"MAX_JOBS": "7"})
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    roles = [p["role"] for p in plan["probes"]]
    assert roles[:3] == ["endpoint (good)", "endpoint (bad)", "probe 1"] and len(roles) == 5
    first = plan["probes"][0]
    assert first["build"] == "source"
    pip, develop = first["commands"]
    assert pip["argv"][1:] == ["-m", "pip", "install", "-r", "requirements/rocm-build.txt"]
    assert develop["argv"][1:] == ["setup.py", "egg_info", "build_ext", "--inplace"]
    assert develop["env"]["PYTORCH_ROCM_ARCH"] == "gfx950" and develop["env"]["MAX_JOBS"] == "7"
    assert "PYTORCH_ROCM_ARCH=gfx950 MAX_JOBS=7" in proc.stdout
    # commits sharing an earlier step's native hash need no build; the probe prefers them
    assert all(p["build"] in ("source", "reuse") for p in plan["probes"])
    assert plan["probes"][2]["build"] == "reuse"
    assert repo.snapshot() == before
    assert not (state / "logs").exists() and not (state / "artifacts").exists()


def test_source_plan_is_vllms_rocm_build():
    rocm = Toolchain(rocm="7.2.1", torch="2.9.1+rocm7.2", python="3.12", arch="gfx942;gfx950")
    plan = source_plan("/env/bin/python", "requirements/build/rocm.txt", rocm, 32,
                       compiler_cache_env("ccache", Path("/state/compiler-cache"), Path("/wt")))
    assert [c.argv for c in plan] == [
        ("/env/bin/python", "-m", "pip", "install", "-r", "requirements/build/rocm.txt"),
        ("/env/bin/python", "setup.py", "egg_info", "build_ext", "--inplace")]
    assert plan[1].env == {"PYTORCH_ROCM_ARCH": "gfx942;gfx950", "MAX_JOBS": "32",
                           "CCACHE_DIR": "/state/compiler-cache/ccache", "CCACHE_BASEDIR": "/wt"}
    sccache = source_plan("py", None, rocm, 8, compiler_cache_env("sccache", Path("/c"), Path("/wt")))
    assert [c.label for c in sccache] == ["develop"] and sccache[0].env["SCCACHE_DIR"] == "/c/sccache"
    wheel = "https://wheels.vllm.ai/rocm/abc/rocm721/vllm-0.20.0-cp38-abi3-linux_x86_64.whl"
    assert precompiled_plan("py", wheel)[0].env == {"VLLM_USE_PRECOMPILED": "1",
                                                    "VLLM_PRECOMPILED_WHEEL_LOCATION": wheel}


def test_native_hash_reads_git_objects_only(make_repo):
    repo = make_repo()
    shas = stand_in(repo, 4, native_at={2}, bad_from=9)
    git = GitRepo(repo.path)
    paths = ("csrc", "setup.py", "requirements/build/rocm.txt", "cmake")
    tool = Toolchain("7.2.1", "2.9.1", "3.12", "gfx942")
    hashes = [native_hash(git.tree_ids(sha, paths), tool) for sha in shas]
    assert hashes[0] == hashes[1] != hashes[2] == hashes[3]
    other_arch = Toolchain("7.2.1", "2.9.1", "3.12", "gfx950")
    assert native_hash(git.tree_ids(shas[0], paths), other_arch) != hashes[0]


def test_artifact_cache_evicts_least_recently_used(tmp_path):
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    cache = ArtifactCache(tmp_path / "state", cap_bytes=250)
    for name in ("a", "b", "c"):
        (work / "pkg" / "_C.so").write_bytes(name.encode() * 100)
        cache.save(name, work, ["pkg/_C.so"], "source", None)
        if name == "b":
            cache.restore("a", work)  # a used after b: b is now least recently used
    assert (cache.get("a"), cache.get("b") is None, cache.get("c")) != (None, False, None)
    assert sorted(p.name for p in (tmp_path / "state" / "artifacts").iterdir()) == ["a", "c"]
    reopened = ArtifactCache(tmp_path / "state", cap_bytes=250)
    assert reopened.get("b") is None and reopened.get("c").size == 100
    reopened.restore("a", work)
    assert (work / "pkg" / "_C.so").read_bytes() == b"a" * 100


def test_bad_build_options_are_usage_errors(make_repo, tmp_path, cli):
    repo = make_repo()
    shas = stand_in(repo, 3, native_at=set(), bad_from=2)
    before = repo.snapshot()
    common = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1],
              "--state-dir", str(tmp_path / "s"), "--build", "auto")
    for extra, message in ((("--cache-size", "lots"), "--cache-size"),
                           (("--wheels", str(tmp_path / "missing")), "neither a directory"),
                           (("--wheels", "https://example.invalid/wheels/"), "needs {commit}")):
        proc = cli(*common, *extra, "--", "true")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("bisector: error: ") and message in proc.stderr
    assert repo.snapshot() == before
    assert parse_size("50G") == 50 * 1024 ** 3 and parse_size("512m") == 512 * 1024 ** 2


def checkout(repo, sha: str, path: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(repo.path), str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "checkout", "-q", sha], check=True)
    return path


class Stamp:
    """A strategy defined here: marks the worktree instead of building, at half a compile's cost."""

    name = "stamp"
    cost = 0.5

    def __init__(self, context):
        self.cache = context.cache

    def can_serve(self, target):
        return Decision(self.name, f"stamped {target.short}", target.native)

    def prepare(self, target, decision, log_dir):
        (target.worktree / "STAMPED").write_text(target.sha)
        return BuildResult(self.name, True, decision.reason, None, target.env)


class Refuses:
    """Cheaper than anything, but serves no commit."""

    name = "refuses"
    cost = -1.0

    def __init__(self, context):
        pass

    def can_serve(self, target):
        return target.refuse("serves nothing")

    def prepare(self, target, decision, log_dir):
        raise AssertionError("a strategy that cannot serve was chosen")


def test_auto_takes_the_cheapest_registered_strategy_that_can_serve(make_repo, tmp_path, monkeypatch):
    monkeypatch.setitem(builds.REGISTRY, Stamp.name, Stamp)
    monkeypatch.setitem(builds.REGISTRY, Refuses.name, Refuses)
    repo = make_repo()
    shas = stand_in(repo, 3, native_at={1}, bad_from=9)
    state = tmp_path / "state"
    builder = BuildSettings("auto", sys.executable).open(GitRepo(repo.path), state)
    # never built, no wheels: reuse and precompiled cannot serve, refuses is passed over, stamp < source
    assert builder.decide(shas[0]).strategy == "stamp" and builder.cost(shas[0]) == 0.5
    work = checkout(repo, shas[0], tmp_path / "work")
    result = builder.prepare(work, shas[0], state / "logs")
    assert (result.ok, result.strategy) == (True, "stamp")
    assert (work / "STAMPED").read_text() == shas[0]
    # once the native hash has artifacts, reuse (cost 0) is cheaper than stamp
    (work / "fixturepkg" / "_C.so").write_bytes(b"built")
    builder.cache.save(builder.native(shas[0]), work, ["fixturepkg/_C.so"], "source", None)
    assert builder.decide(shas[0]).strategy == "reuse" and builder.decide(shas[1]).strategy == "stamp"
    # chosen by name, a strategy that cannot serve skips the commit with its reason
    refused = BuildSettings("refuses", sys.executable).open(GitRepo(repo.path), state) \
        .prepare(work, shas[0], state / "logs")
    assert (refused.ok, refused.reason) == (False, "serves nothing (--build refuses)")


def test_a_wheel_that_fails_falls_back_to_a_compile_in_auto_only(make_repo, venv_python, tmp_path):
    repo = make_repo()
    shas = stand_in(repo, 3, native_at=set(), bad_from=9)
    wheels = tmp_path / "wheels"
    (wheels / shas[1]).mkdir(parents=True)
    (wheels / shas[1] / "fixturepkg-0-cp311-abi3-linux_x86_64.whl").write_text("not a zip")
    state = tmp_path / "state"
    work = checkout(repo, shas[1], tmp_path / "work")
    precompiled = BuildSettings("precompiled", venv_python, wheels=str(wheels)).open(GitRepo(repo.path), state)
    no_wheel = precompiled.prepare(work, shas[0], state / "logs")
    assert not no_wheel.ok and no_wheel.reason == f"no wheel for {shas[0][:12]} (--build precompiled)"
    broken = precompiled.prepare(work, shas[1], state / "logs")
    assert (broken.ok, broken.strategy) == (False, "precompiled")
    assert gcc_runs(state) == 0
    auto = BuildSettings("auto", venv_python, wheels=str(wheels), install_into_python=True).open(GitRepo(repo.path),
                                                                                                 state)
    assert auto.decide(shas[1]).strategy == "precompiled"
    result = auto.prepare(work, shas[1], state / "logs")
    assert (result.ok, result.strategy) == (True, "source"), result.reason
    assert "(after precompiled failed: develop-precompiled exited 1" in result.reason
    assert gcc_runs(state) == 1 and list((work / "fixturepkg").glob("_C*.so"))


def test_a_reused_build_brings_back_every_file_the_build_added(make_repo, tmp_path):
    """Not only extension modules: a wheel's generated and vendored Python (vllm/_version.py,
    vllm/third_party/flashmla) must come back with a reused build, or backends that need them fail."""
    from bisector.builds.base import built_outputs
    from bisector.repo.refs import GitRepo as Repo
    from bisector.repo.worktrees import WorktreePool

    repo = make_repo()
    sha = repo.commit("pkg", {"pkg/__init__.py": "", ".gitignore": "build/\n*.so\n*.egg-info/\n__pycache__/\n"})
    added = {"pkg/_C.abi3.so": b"elf", "pkg/_version.py": b"__version__ = '1'\n",
             "pkg/third_party/flashmla/__init__.py": b"x = 1\n"}
    scratch = {"build/temp/native.o": b"o", "pkg/__pycache__/x.cpython-311.pyc": b"c",
               "pkg.egg-info/PKG-INFO": b"m"}
    with WorktreePool(Repo(repo.path), tmp_path / "state") as pool, pool.checkout(sha) as work:
        for rel, data in {**added, **scratch}.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(data)
        assert sorted(built_outputs(work)) == sorted(added)
        cache = ArtifactCache(tmp_path / "state", parse_size("1G"))
        cache.save("n" * 64, work, built_outputs(work), "precompiled", None)
        for rel in added:
            (work / rel).unlink()
        cache.restore("n" * 64, work)
        assert {rel: (work / rel).read_bytes() for rel in added} == added
