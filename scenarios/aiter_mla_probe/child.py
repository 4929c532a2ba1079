"""The probe proper, run in a fresh interpreter per commit:

    python -m scenarios.aiter_mla_probe.child CHECKOUT CONFIG_JSON

Prints diagnostics, then one line `PROBE-RESULT {"verdict": ..., "reason": ..., "details": {...}}`.
"""
from __future__ import annotations

import ast
import functools
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from scenarios.aiter_mla_probe.contract import ProbeConfig, judge

RESULT_PREFIX = "PROBE-RESULT "
TARGET_MODULE = "vllm.v1.attention.backends.mla.rocm_aiter_mla"
TARGET_FILE = Path(*TARGET_MODULE.split(".")).with_suffix(".py")
METADATA_CALL = "get_mla_metadata_info_v1"
QUANT_QUERY_FLAG = "supports_quant_query_input"


def probe(checkout: Path, config: ProbeConfig) -> dict:
    """Judge the checkout: a dict with verdict, reason and details."""
    target = checkout / TARGET_FILE
    if not target.is_file():
        return _result("good", f"code path absent: no {TARGET_FILE}")
    if METADATA_CALL not in target.read_text(errors="replace"):
        return _result("good", f"code path absent: {TARGET_FILE} sizes no persistent AITER MLA metadata "
                               f"(no {METADATA_CALL})")
    try:
        import torch  # the checkout's code needs it; nothing else is required
    except ImportError:
        return _result("skip", f"torch not installed in {sys.executable}; pip install 'bisector[probe]'")

    from scenarios.aiter_mla_probe import environment as env
    from scenarios.aiter_mla_probe.loader import SourceImporter, available_top_levels

    calls: list[dict] = []
    vllm_config = env.vllm_config(config)
    stand_ins = {"aiter": env.aiter_stand_in(config, calls), "vllm.platforms": env.platform_stand_in(config),
                 "vllm.distributed": env.distributed_stand_in(), "vllm.config": env.config_stand_in(vllm_config)}
    importer = SourceImporter(checkout, stand_ins, available_top_levels()).install()
    module = importlib.import_module(TARGET_MODULE)
    loader_details = {"modules_failed": importer.failures, "modules_stubbed": len(importer.stubbed)}
    builder_cls = getattr(module, "AiterMLAMetadataBuilder", None)
    if not _is_real_class(builder_cls):
        failure = importer.failures.get(TARGET_MODULE, "AiterMLAMetadataBuilder not defined")
        return _result("skip", f"cannot load {TARGET_FILE}: {failure}", loader_details)

    try:
        builder_cls(env.kv_cache_spec(config), [env.LAYER_NAME], vllm_config, torch.device("cpu"))
        construction_error = None
    except Exception as exc:  # judged below if the metadata was sized before the failure
        construction_error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    details = {**loader_details, "calls": calls, "construction_error": construction_error}
    if not calls:
        if construction_error:
            return _result("skip", f"AiterMLAMetadataBuilder failed before sizing metadata: "
                                   f"{construction_error}", details)
        return _result("good", f"code path absent: AiterMLAMetadataBuilder sized no persistent metadata "
                               f"for this configuration", details)

    quantizes, flag_source = quantizes_query(getattr(module, "AiterMLAImpl", None))
    kernel_q = "fp8" if config.kv_is_fp8 and quantizes else env.dtype_name(env.MODEL_DTYPE)
    judgements = [judge(config, call, kernel_q) for call in calls]
    chosen = next((j for j in judgements if j.verdict == "bad"), judgements[0])
    details.update(chosen.details, quant_query_input=quantizes, quant_query_input_source=flag_source)
    return _result(chosen.verdict, chosen.reason, details)


def quantizes_query(impl_cls) -> tuple[bool, str]:
    """Whether the impl keeps `supports_quant_query_input` true, and where that was read.

    Read from the checkout's source of the impl's classes: the most derived
    `self.supports_quant_query_input = ` wins over any class attribute; with no assignment anywhere,
    MLACommonImpl's True applies.
    """
    found: dict[str, list] = {"instance": [], "class": []}
    for cls in getattr(impl_cls, "__mro__", ()):
        class_def = _class_def(cls)
        for kind, value in _flag_assignments(class_def) if class_def else ():
            found[kind].append((cls.__qualname__, value))
    for kind in ("instance", "class"):
        if found[kind]:
            owner, value = found[kind][0]
            if isinstance(value, bool):
                return value, f"{owner} ({kind} attribute)"
            return True, f"{owner} sets it from an expression; assumed true"
    return True, "not set in the checkout's classes; MLACommonImpl's default (true)"


def _class_def(cls) -> ast.ClassDef | None:
    """The top-level definition of a real class from the checkout's `vllm` source."""
    module = sys.modules.get(getattr(cls, "__module__", ""))
    if not _is_real_class(cls) or module is None or not module.__name__.startswith("vllm") \
            or not getattr(module, "__file__", None):
        return None
    return next((node for node in _parsed(module.__file__).body
                 if isinstance(node, ast.ClassDef) and node.name == cls.__name__), None)


@functools.cache
def _parsed(path: str) -> ast.Module:
    return ast.parse(Path(path).read_bytes(), path)


def _flag_assignments(class_def: ast.ClassDef):
    """(kind, literal value or None) for each assignment of the flag in class_def."""
    for node in class_def.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == QUANT_QUERY_FLAG for t in targets) and node.value:
                yield "class", _literal(node.value)
    for node in ast.walk(class_def):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == QUANT_QUERY_FLAG \
                        and isinstance(target.value, ast.Name) and target.value.id == "self":
                    yield "instance", _literal(node.value)


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _is_real_class(obj) -> bool:
    return isinstance(obj, type) and not obj.__dict__.get("_is_placeholder")


def _result(verdict: str, reason: str, details: dict | None = None) -> dict:
    return {"verdict": verdict, "reason": reason, "details": details or {}}


def main(argv: list[str]) -> int:
    checkout, config_json = argv
    start = time.monotonic()
    result = probe(Path(checkout).resolve(), ProbeConfig(**json.loads(config_json)))
    result["details"]["child_seconds"] = round(time.monotonic() - start, 3)
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
