"""A culprit that pins AITER where its parent pinned none (or drops the pin): the answer says so and offers no
continuation inside AITER, as there is no range to bisect there (shlex.join was given None for the missing end
and the continuation read `--good ''`)."""
import json

import pytest

pytestmark = pytest.mark.integration

PINNED = "ARG BASE_IMAGE=rocm/dev-ubuntu-22.04\nARG AITER_BRANCH=v0.1.13\n"
UNPINNED = "ARG BASE_IMAGE=rocm/dev-ubuntu-22.04\n"


@pytest.mark.parametrize("pinned_from, change", [(3, {"name": "aiter", "from": None, "to": "v0.1.13"}),
                                                 (0, {"name": "aiter", "from": "v0.1.13", "to": None})])
def test_a_pin_on_one_side_only_is_named_without_a_continuation(make_repo, tmp_path, cli, state_is_good,
                                                                pinned_from, change):
    repo = make_repo()
    def pinned(i):  # from commit 3 on (the culprit) when pinned_from is 3, else before it
        return (i >= 3) == (pinned_from == 3)
    shas = [repo.commit(f"change {i}", {"state": "good\n" if i < 3 else "bad\n",
                                        "docker/Dockerfile.rocm_base": PINNED if pinned(i) else UNPINNED})
            for i in range(5)]
    out = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--state-dir",
              str(tmp_path / "state"), "--json", str(tmp_path / "r.json"), "--", *state_is_good)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["first_bad"]["sha"] == shas[3]
    assert result["pin_change"] == change
    assert result["pin_continuation"] == ""
    assert "continue inside AITER" not in out.stdout
