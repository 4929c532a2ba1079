"""aiter-mla-probe on real vLLM release source: the required verdicts.

The release sources come from the `vllm_sources` fixture (conftest.py): sdists fetched once into
~/.cache/vllm-sdists, their `vllm/**.py` files extracted beside them.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from scenarios.aiter_mla_probe import AiterMLAProbe
from scenarios.base import StepContext, Verdict

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch not installed; pip install 'bisector[probe]'")]

VERSIONS = ("0.18.1", "0.19.0", "0.24.0", "0.25.0", "0.27.0")
TARGET = "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
FIX_CONTEXT = ('        if kv_cache_dtype_str in ("fp8", "fp8_e4m3", "fp8_e5m2"):\n'
               '            kv_cache_dtype_str = "fp8"\n')
FIX_LINE = "            q_dtype = dtypes.fp8\n"  # upstream PR 47276


@pytest.fixture(scope="module")
def releases(tmp_path_factory, vllm_sources) -> dict[str, Path]:
    """Checkouts by ref: v<version> for each of VERSIONS, and fix-47276 (v0.24.0 plus the fix)."""
    trees = {f"v{version}": vllm_sources(version) for version in VERSIONS}
    trees["fix-47276"] = tmp_path_factory.mktemp("vllm-releases") / "fix-47276"
    shutil.copytree(trees["v0.24.0"], trees["fix-47276"])
    target = trees["fix-47276"] / TARGET
    source = target.read_text()
    assert source.count(FIX_CONTEXT) == 1
    target.write_text(source.replace(FIX_CONTEXT, FIX_CONTEXT + FIX_LINE))
    return trees


def probe(checkout: Path, tmp_path: Path, **options: str):
    ctx = StepContext(checkout=checkout, log_path=tmp_path / "probe.log", python=sys.executable)
    return AiterMLAProbe(options).run(ctx)


@pytest.mark.parametrize("ref, verdict, reason_start", [
    ("v0.18.1", Verdict.GOOD, "code path absent"),
    ("v0.19.0", Verdict.BAD, "q dtype mismatch changes AITER tiling"),
    ("v0.24.0", Verdict.BAD, "q dtype mismatch changes AITER tiling"),
    ("fix-47276", Verdict.GOOD, "consistent"),
    ("v0.25.0", Verdict.GOOD, "consistent"),
    ("v0.27.0", Verdict.GOOD, "consistent"),
])
def test_release_verdicts(releases, tmp_path, ref, verdict, reason_start):
    outcome = probe(releases[ref], tmp_path)
    assert (outcome.verdict, outcome.reason[:len(reason_start)]) == (verdict, reason_start), outcome.reason
    if verdict is Verdict.BAD:
        assert "sized for q bf16 (8 tiles per batch)" in outcome.reason
        assert "kernel gets q fp8 (1 tile per batch)" in outcome.reason and "128 heads" in outcome.reason


@pytest.mark.parametrize("ref", ["v0.19.0", "v0.24.0"])
def test_tp8_hides_the_bug(releases, tmp_path, ref):
    outcome = probe(releases[ref], tmp_path, heads="16")
    assert outcome.verdict is Verdict.GOOD, outcome.reason
    assert outcome.reason.startswith("q dtype mismatch without effect") and "16 heads" in outcome.reason


# --- the mutation matrix: rewrites of the upstream fix on v0.24.0, and the verdict each must get ---

BUGGY_LINE = "        q_dtype = self.decode_attn_out_dtype\n"
CALL_ARGUMENTS = "            q_dtype,\n            kv_dtype,\n"
KV_LINE = "        kv_dtype = dtypes.d_dtypes.get(kv_cache_dtype_str, dtypes.bf16)\n"
END = None  # an edit that appends to the file
HELPER = '''

def _decode_query_dtype(vllm_config, default):
    """The decode kernel's query dtype: fp8 with an fp8 KV cache."""
    from aiter import dtypes

    if vllm_config.cache_config.cache_dtype.startswith("fp8"):
        return dtypes.fp8
    return default
'''
MUTANTS = {
    # equivalent rewrites: a real MI300 runs them correctly, so they must be good
    "upstream fix": ([(FIX_CONTEXT, FIX_CONTEXT + FIX_LINE)], Verdict.GOOD),
    "moved into a helper": ([(BUGGY_LINE, "        q_dtype = _decode_query_dtype(vllm_config, "
                                          "self.decode_attn_out_dtype)\n"), (END, HELPER)], Verdict.GOOD),
    "reflowed": ([(BUGGY_LINE, "        q_dtype = (\n            dtypes.fp8\n            if getattr(\n"
                               "                vllm_config.cache_config, \"cache_dtype\", \"auto\"\n"
                               "            ).startswith(\"fp8\")\n"
                               "            else self.decode_attn_out_dtype\n        )\n")], Verdict.GOOD),
    "renamed": ([(BUGGY_LINE, BUGGY_LINE.replace("q_dtype", "query_dtype")),
                 (FIX_CONTEXT, FIX_CONTEXT + FIX_LINE.replace("q_dtype", "query_dtype")),
                 (CALL_ARGUMENTS, CALL_ARGUMENTS.replace("q_dtype", "query_dtype"))], Verdict.GOOD),
    "guarded by a platform check": ([(FIX_CONTEXT, FIX_CONTEXT + "            from vllm.platforms import "
                                      "current_platform\n\n            if current_platform.supports_fp8():\n"
                                      "                q_dtype = dtypes.fp8\n")], Verdict.GOOD),
    # broken ones: the kernel still gets fp8 Q against bf16-sized metadata
    "dead under if False": ([(FIX_CONTEXT, FIX_CONTEXT + "            if False:\n"
                                           "                q_dtype = dtypes.fp8\n")], Verdict.BAD),
    "overridden after the assignment": ([(FIX_CONTEXT, FIX_CONTEXT + FIX_LINE),
                                         (KV_LINE, KV_LINE + BUGGY_LINE)], Verdict.BAD),
    "replaced by bf16": ([(FIX_CONTEXT, FIX_CONTEXT + "            q_dtype = dtypes.bf16\n")], Verdict.BAD),
    # no evidence: real vLLM raises AttributeError here
    "attribute that does not exist": ([(FIX_CONTEXT, FIX_CONTEXT + "            q_dtype = vllm_config."
                                                     "model_config.no_such_attribute\n")], Verdict.SKIP),
}


def mutate(source: str, edits) -> str:
    for old, new in edits:
        if old is END:
            source += new
            continue
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


@pytest.mark.parametrize("name", MUTANTS)
def test_mutation_matrix(releases, tmp_path, name):
    edits, verdict = MUTANTS[name]
    tree = tmp_path / "vllm"
    shutil.copytree(releases["v0.24.0"], tree)
    target = tree / TARGET
    target.write_text(mutate(target.read_text(), edits))
    outcome = probe(tree, tmp_path)
    assert outcome.verdict is verdict, f"{name}: {outcome.reason}"
    if verdict is Verdict.SKIP:
        assert "vllm_config.model_config.no_such_attribute" in outcome.reason
