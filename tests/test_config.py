"""Configuration (bisector/cli/config.py): the user's config.toml, [tool.bisector] in the bisected repository's
pyproject.toml and BISECTOR_* variables give defaults; the command line overrides them all. Read through
the real CLI, with HOME / XDG_CONFIG_HOME pointed at temp dirs."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_aiter_mla_probe_pins import FAKE_URL, make_aiter, make_vllm

pytestmark = pytest.mark.integration

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch not installed; pip install 'bisector[probe]'")
KNOWN = "known: aiter_repo, executor, gpus, image, state_dir"


@pytest.fixture
def world(tmp_path, repo_builder):
    """A repository (one commit), a HOME and an XDG config home, each empty of configuration."""
    repo = repo_builder(tmp_path / "repo")
    repo.commit("first", {"a.txt": "a\n"})
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    xdg.mkdir()
    return {"repo": repo, "home": home, "xdg": xdg, "tmp": tmp_path, "env": {"HOME": str(home),
                                                                          "XDG_CONFIG_HOME": str(xdg)}}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def doctor_lines(cli, repo: Path, *args: str, env: dict) -> list[str]:
    done = cli("doctor", "--repo", str(repo), *args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


# --- precedence: command line > environment > repository > user file ------------------------------

@pytest.mark.parametrize("level", ["user file", "XDG user file", "repository", "environment", "command line"])
def test_each_level_overrides_the_ones_below_it(cli, world, level):
    tmp, env = world["tmp"], dict(world["env"])
    if level == "user file":  # XDG_CONFIG_HOME empty (as unset): ~/.config
        env["XDG_CONFIG_HOME"] = ""
        write(world["home"] / ".config" / "bisector" / "config.toml", f'state_dir = "{tmp / "from-user"}"\n')
    else:  # XDG_CONFIG_HOME set: ~/.config is not read
        write(world["home"] / ".config" / "bisector" / "config.toml", f'state_dir = "{tmp / "from-home"}"\n')
        write(world["xdg"] / "bisector" / "config.toml", f'state_dir = "{tmp / "from-xdg"}"\n')
    if level in ("repository", "environment", "command line"):
        write(world["repo"].path / "pyproject.toml", '[project]\nname = "x"\n\n[tool.bisector]\n'
                                                     'state_dir = "../from-repo"\n')
    if level in ("environment", "command line"):
        env["BISECTOR_STATE_DIR"] = str(tmp / "from-env")
    args = ("--state-dir", str(tmp / "from-cli")) if level == "command line" else ()
    expected, source = {
        "user file": ("from-user", str(world["home"] / ".config" / "bisector" / "config.toml")),
        "XDG user file": ("from-xdg", str(world["xdg"] / "bisector" / "config.toml")),
        "repository": ("from-repo", f"{world['repo'].path / 'pyproject.toml'} [tool.bisector]"),
        "environment": ("from-env", "$BISECTOR_STATE_DIR"),
        "command line": ("from-cli", "command line, --state-dir")}[level]
    lines = doctor_lines(cli, world["repo"].path, *args, env=env)
    assert f"state dir: {tmp / expected} (not created yet)" in lines  # the state dir the command uses
    assert f"config state_dir: {tmp / expected} ({source})" in lines


def test_repository_config_is_read_from_the_top_of_the_repository_given(cli, world):
    """--repo names the repository (a subdirectory of it too); the cwd is elsewhere."""
    write(world["repo"].path / "pyproject.toml", '[tool.bisector]\nstate_dir = "kept-here"\n')
    (world["repo"].path / "sub").mkdir()
    done = cli("runs", "--repo", str(world["repo"].path / "sub"), cwd=world["tmp"], env=world["env"])
    assert done.stderr == f"bisector: error: no bisector record in {world['repo'].path / 'kept-here'}\n"
    assert not (world["repo"].path / ".git" / "bisector").exists()


def test_doctor_prints_each_value_and_where_it_came_from(cli, world):
    user = write(world["xdg"] / "bisector" / "config.toml", 'executor = "ray"\ngpus = [0, 1]\n')
    pyproject = write(world["repo"].path / "pyproject.toml", '[tool.bisector]\ngpus = "2"\nimage = "r/v:{short}"\n')
    env = {**world["env"], "BISECTOR_IMAGE": "env/v:{commit}", "BISECTOR_STATE_DIR": str(world["tmp"] / "env-st")}
    done = cli("doctor", "--repo", str(world["repo"].path), "--state-dir", str(world["tmp"] / "cli-st"), env=env)
    assert done.returncode == 0, done.stderr
    config = [line for line in done.stdout.splitlines() if line.startswith("config")]
    assert config == [
        "config: command line > environment (BISECTOR_*) > repository ([tool.bisector] in pyproject.toml) > user file",
        "config aiter_repo: the repository each commit pins (ROCm/aiter) (default)",
        f"config executor: ray ({user})",
        f"config gpus: 2 ({pyproject} [tool.bisector])",
        "config image: env/v:{commit} ($BISECTOR_IMAGE)",
        f"config state_dir: {world['tmp'] / 'cli-st'} (command line, --state-dir)",
    ]
    assert f"state dir: {world['tmp'] / 'cli-st'}" in done.stdout


def test_configured_executor_reaches_run_and_the_command_line_overrides_it(cli, world):
    write(world["xdg"] / "bisector" / "config.toml", 'executor = "no-such-executor"\n')
    shas = world["repo"].linear(2, bad_from=1)
    run = ("run", "--repo", str(world["repo"].path), "--good", shas[0], "--bad", shas[1], "--plan", "--", "true")
    configured = cli(*run, env=world["env"])
    assert configured.returncode == 2
    assert configured.stderr == ("bisector: error: Invalid value for '--executor': 'no-such-executor' is not one of "
                                 f"'local', 'ray'. (configured: {world['xdg'] / 'bisector' / 'config.toml'})\n")
    overridden = cli(*run[:-2], "--executor", "local", "--", "true", env=world["env"])
    assert overridden.returncode == 0, overridden.stderr


# --- bad configuration: one line, exit 2, the repository as it was -------------------------------

@pytest.mark.parametrize("where, text, message", [
    ("user", 'state_dir = "/x"\ncolour = "red"\n', "{path}: unknown key 'colour' (" + KNOWN + ")"),
    ("repository", '[tool.bisector]\nimage = "a:{commit}"\nstate-dir = "x"\n',
     "{path} [tool.bisector]: unknown key 'state-dir' (" + KNOWN + ")"),
    ("repository", '[project]\nname = "x"\n\n[tool.bisector]\nstate_dir = \n',
     "{path}:5: not valid TOML: Invalid value"),
    ("user", 'gpus = "0"\n[broken\n', "{path}:2: not valid TOML: Expected ']' at the end of a table declaration"),
    ("repository", '[tool.bisector]\ngpus = true\n',
     "{path} [tool.bisector]: gpus must be a non-empty string or a list of GPU ids, got True"),
])
def test_bad_configuration_is_one_line_exit_2_and_the_repository_untouched(cli, world, where, text, message):
    repo = world["repo"]
    path = repo.path / "pyproject.toml" if where == "repository" else world["xdg"] / "bisector" / "config.toml"
    write(path, text)
    repo.commit("configure", {})  # the pyproject tracked: the snapshot holds the work tree exactly
    before = repo.snapshot()
    done = cli("run", "--repo", str(repo.path), "--good", "HEAD~1", "--bad", "HEAD", "--", "true", env=world["env"])
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"bisector: error: {message.format(path=path)}\n"
    assert repo.snapshot() == before
    assert not (repo.path / ".git" / "bisector").exists()
    listed = cli("--help", env=world["env"])  # read only when a command runs
    assert listed.returncode == 0 and "Commands:" in listed.stdout


# --- aiter_repo: one name for AITER's repository ----------------------------------------------------

@pytest.fixture
def probe_repos(tmp_path, monkeypatch):
    """A vLLM-shaped repository pinning AITER at an unreachable URL, and a local AITER clone."""
    monkeypatch.setenv("BISECTOR_AITER_CACHE", str(tmp_path / "aiter-cache"))
    aiter, vllm = tmp_path / "aiter", tmp_path / "vllm"
    return {"aiter": aiter, "aiter_shas": make_aiter(aiter), "vllm": vllm, "vllm_shas": make_vllm(vllm)}


def probe(cli, tmp_path, repos, *args: str, env: dict) -> dict:
    """`scenario run aiter-mla-probe` on the last vLLM commit; its JSON outcome."""
    out = tmp_path / f"outcome-{len(list(tmp_path.glob('outcome-*')))}.json"
    done = cli("scenario", "run", "aiter-mla-probe", "--repo", str(repos["vllm"]), "--ref", repos["vllm_shas"]["c2"],
               "--option", "arch=gfx950", "--state-dir", str(tmp_path / "state"), "--json", str(out), *args, env=env)
    assert done.returncode in (0, 1, 125), done.stderr
    return json.loads(out.read_text())


def test_the_clone_error_names_the_option_and_the_config_key(cli, tmp_path, probe_repos):
    outcome = probe(cli, tmp_path, probe_repos, env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert outcome["verdict"] == "skip"
    assert outcome["reason"].startswith(f"cannot clone {FAKE_URL}: ")
    assert outcome["reason"].endswith("; give a local clone with --option aiter_repo=PATH, or set aiter_repo once "
                                      "for every command: $BISECTOR_AITER_REPO, [tool.bisector] in the repository's "
                                      "pyproject.toml, or ~/.config/bisector/config.toml (docs/configuration.md)")


@needs_torch
@pytest.mark.parametrize("how", ["--aiter-repo", "repository", "user file", "environment"])
def test_aiter_repo_is_one_setting_under_every_spelling(cli, tmp_path, probe_repos, how):
    aiter, env = str(probe_repos["aiter"]), {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    args: tuple[str, ...] = ()
    if how == "--aiter-repo":  # the alias: fed to the probe's option (once refused without --aiter pinned)
        args = ("--aiter-repo", aiter)
    elif how == "repository":
        write(probe_repos["vllm"] / "pyproject.toml", f'[tool.bisector]\naiter_repo = "../{Path(aiter).name}"\n')
    elif how == "user file":
        write(tmp_path / "xdg" / "bisector" / "config.toml", f'aiter_repo = "{aiter}"\n')
    else:
        env["BISECTOR_AITER_REPO"] = aiter
    outcome = probe(cli, tmp_path, probe_repos, *args, env=env)
    assert outcome["verdict"] == "good", outcome["reason"]
    found = outcome["details"]["aiter"]
    assert (found["repo"], found["version"]) == (aiter, "v2.0")
    assert found["origin"] == "pinned by docker/Dockerfile.rocm_base, --option aiter_repo"


def test_two_spellings_with_two_values_are_refused(cli, tmp_path, probe_repos):
    done = cli("scenario", "run", "aiter-mla-probe", "--repo", str(probe_repos["vllm"]), "--option", "aiter_repo=/a",
               "--aiter-repo", "/b", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert (done.returncode, done.stderr) == (2, "bisector: error: --aiter-repo /b and --option aiter_repo=/a name "
                                                 "AITER's one repository twice: give it once, as --option "
                                                 "aiter_repo=PATH|URL\n")


@needs_torch
def test_the_command_line_aiter_repo_overrides_the_configured_one(cli, tmp_path, probe_repos):
    other = "https://aiter.invalid/other.git"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "BISECTOR_AITER_REPO": str(probe_repos["aiter"])}
    write(probe_repos["vllm"] / "pyproject.toml", f'[tool.bisector]\naiter_repo = "{other}"\n')
    configured = probe(cli, tmp_path, probe_repos, env=env)  # the environment over the repository
    assert configured["verdict"] == "good" and configured["details"]["aiter"]["repo"] == str(probe_repos["aiter"])
    given = probe(cli, tmp_path, probe_repos, "--option", f"aiter_repo={other}", env=env)
    assert given["verdict"] == "skip" and given["reason"].startswith(f"cannot clone {other}: ")
