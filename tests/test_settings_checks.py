"""The checks on option combinations live on the settings types (WorldSettings.from_options,
BuildSettings.from_options): every command that builds settings gets the same one-line UsageError; a
value that came from configuration is a default, never refused for being there."""
from __future__ import annotations

import pytest

from bisector.builds import BuildSettings
from bisector.cli.options import one_aiter_repo
from bisector.errors import UsageError
from bisector.world.world import WorldOptions, WorldSettings
from scenarios.aiter_mla_probe import AiterMLAProbe
from scenarios.dpa_fp8_kv import DpaFp8KvScenario

pytestmark = pytest.mark.unit


def world(configured: tuple[str, ...] = (), **given) -> WorldOptions:
    return WorldOptions(**given, configured=frozenset(configured))


@pytest.mark.parametrize("given, message", [
    ({"image_fallback": "build"}, "--image-fallback needs --image"),
    ({"aiter_prebuild": True}, "--aiter-prebuild needs --aiter pinned"),
    ({"aiter_repo": "/src/aiter"}, "--aiter-repo needs --aiter pinned (or a scenario that clones AITER itself, as "
                                   "aiter-mla-probe does, or --follow-pins with a scenario that judges AITER "
                                   "commits)"),
    ({"image": "r/v:{commit}", "aiter": "pinned"}, "--image brings each commit's own AITER (the one its image was "
                                                   "built with): --aiter is for bare metal"),
])
def test_world_settings_refuse_combinations_that_cannot_work(given, message):
    with pytest.raises(UsageError) as refused:
        WorldSettings.from_options(world(**given), DpaFp8KvScenario(), "shared")
    assert refused.value.message() == message


def test_a_configured_aiter_repo_is_a_default_not_a_mistake():
    bare = WorldSettings.from_options(world(("aiter_repo",), aiter_repo="/src/aiter"), DpaFp8KvScenario(), "shared")
    assert bare.aiter_settings.repo is None  # no --aiter pinned: nothing reads it
    pinned = WorldSettings.from_options(world(("aiter_repo",), aiter_repo="/src/aiter", aiter="pinned"),
                                        DpaFp8KvScenario(), "shared")
    assert pinned.aiter_settings.repo == "/src/aiter"
    probe = WorldSettings.from_options(world(aiter_repo="/src/aiter"), AiterMLAProbe(), "shared")
    assert probe.aiter_settings.repo is None  # --aiter-repo feeds the probe's option (one_aiter_repo)


def test_one_aiter_repo_feeds_both_readers():
    pairs, fed = one_aiter_repo(("arch=gfx950",), "aiter-mla-probe", world(aiter_repo="/src/aiter"))
    assert pairs == ("arch=gfx950", "aiter_repo=/src/aiter") and fed.aiter_repo == "/src/aiter"
    pairs, fed = one_aiter_repo(("aiter_repo=/src/aiter",), "dpa-fp8-kv-graph-capture",
                                world(("aiter_repo",), aiter_repo="/configured", aiter="pinned"))
    assert pairs == () and fed.aiter_repo == "/src/aiter" and not fed.configured
    with pytest.raises(UsageError, match="name AITER's one repository twice"):
        one_aiter_repo(("aiter_repo=/a",), "aiter-mla-probe", world(aiter_repo="/b"))


def test_build_settings_check_their_options():
    assert BuildSettings.from_options(None, "python3", None, None, "1G", ("true",)).strategy == "none"
    assert BuildSettings.from_options(None, "python3", None, None, "1G").strategy == "auto"
    with pytest.raises(UsageError) as refused:
        BuildSettings.from_options("auto", "python3", None, None, "lots")
    assert refused.value.message().startswith("--cache-size: ")
