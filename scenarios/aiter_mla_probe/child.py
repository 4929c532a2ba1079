"""The probe proper, run in a fresh interpreter per commit:

    python -m scenarios.aiter_mla_probe.child CHECKOUT CONFIG_JSON AITER_JSON

Prints diagnostics, then one line `PROBE-RESULT {"verdict": ..., "reason": ..., "details": {...}}`.
It fails closed: a verdict needs real torch dtypes at the sizing call, no placeholder on the way there,
the checkout's own decision about the decode query dtype, and every module on that path loaded.
"""
from __future__ import annotations

import ast
import builtins
import dis
import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TypeGuard

from scenarios.aiter_mla_probe.contract import RESULT_PREFIX, ProbeConfig, judge

TARGET_MODULE = "vllm.v1.attention.backends.mla.rocm_aiter_mla"
TARGET_FILE = Path(*TARGET_MODULE.split(".")).with_suffix(".py")
METADATA_CALL = "get_mla_metadata_info_v1"
QUANT_QUERY_FLAG = "supports_quant_query_input"
PLATFORM_MODULE = "vllm.platforms.rocm"
# The checkout's own code under stand-in packages: the platform, and the KV cache dtype handlers.
SOURCE_BELOW_STAND_INS = {"vllm.platforms", "vllm.config.cache"}
SIZE_ARGUMENTS = ("batch_size", "max_seqlen_qo", "num_head_qo")
DTYPE_ARGUMENTS = ("q_dtype", "kv_dtype")
FLAG_ARGUMENTS = ("is_sparse", "fast_mode")
LISTED = 20  # placeholders named in details


class Unjudgeable(Exception):
    """The probe lacks the evidence for a verdict: skip, with this reason."""


def aiter_label(aiter: dict) -> str:
    """"AITER v0.1.13 (1a2b3c4d5e)", or the rule's name when no AITER source is used."""
    if not aiter.get("path"):
        return "hand-written AITER tile rule"
    full, version = aiter.get("commit") or "", aiter.get("version") or ""
    named = version and not full.startswith(version)  # a tag or branch, not the commit's own sha said again
    return f"AITER {version} ({full[:10]})" if named else f"AITER {full[:10]}"


def probe(checkout: Path, config: ProbeConfig, aiter: dict | None = None) -> dict:
    """Judge the checkout: a dict with verdict, reason and details."""
    target = checkout / TARGET_FILE
    if not target.is_file():
        return _result("good", f"code path absent: no {TARGET_FILE}")
    if METADATA_CALL not in target.read_text(errors="replace"):
        return _result("good", f"code path absent: {TARGET_FILE} sizes no persistent AITER MLA metadata "
                               f"(no {METADATA_CALL})")
    try:
        import torch  # noqa: F401 - the checkout's code needs it; nothing else is required
    except ImportError:
        return _result("skip", f"torch not installed in {sys.executable}; pip install 'bisector[probe]'")
    details: dict = {}
    try:
        return Probe(checkout, config, details, aiter or {"path": None}).run()
    except Unjudgeable as exc:
        return _result("skip", str(exc), details)


class Probe:
    """One checkout, one configuration: loads the code, builds the metadata builder, judges."""

    def __init__(self, checkout: Path, config: ProbeConfig, details: dict, aiter: dict):
        from scenarios.aiter_mla_probe import environment as env
        from scenarios.aiter_mla_probe.loader import PLACEHOLDERS
        self.env, self.placeholders = env, PLACEHOLDERS
        self.checkout, self.config, self.details, self.aiter = checkout, config, details, aiter
        self.calls: list[dict] = []
        self.failure: Exception | None = None  # what the builder's construction raised
        self.made: list[str] = []  # the placeholders made while it was built, in order
        self.sizing = env.rule_sizing(config)
        details["aiter"] = aiter if aiter.get("path") else {**aiter, "source": "hand-written tile rule"}
        self.label = aiter_label(aiter)

    def run(self) -> dict:
        from scenarios.aiter_mla_probe.loader import SourceImporter, available_top_levels
        env, config, details = self.env, self.config, self.details
        env.answer_hardware_queries(config)
        vllm_config = env.vllm_config(config)
        proxy = env.PlatformProxy(lambda: env.modelled_platform(config))
        recorder = self._recording_sizing()
        stand_ins = {"vllm.platforms": env.platforms_stand_in(proxy), "vllm.distributed": env.distributed_stand_in(),
                     "vllm.config": env.config_stand_in(vllm_config)}
        roots = {}
        if self.aiter.get("path"):
            stand_ins.update(env.aiter_source_stand_ins(config, recorder))
            roots["aiter"] = Path(self.aiter["path"])
        else:
            stand_ins["aiter"] = env.aiter_stand_in(config, recorder)
        self.importer = SourceImporter(self.checkout, stand_ins, available_top_levels(),
                                       source_below=SOURCE_BELOW_STAND_INS | set(roots), other_roots=roots).install()
        if roots:
            self.sizing = self._aiter_sizing(roots["aiter"])
        module = importlib.import_module(TARGET_MODULE)
        self.platform = proxy.resolve()
        details["platform"] = proxy.description
        details.update(modules_failed=self.importer.failures, modules_stubbed=len(self.importer.stubbed))
        builder_cls = getattr(module, "AiterMLAMetadataBuilder", None)
        if not _is_real_class(builder_cls):
            failure = self.importer.failures.get(TARGET_MODULE, "AiterMLAMetadataBuilder not defined")
            raise Unjudgeable(f"cannot load {TARGET_FILE}: {failure}")

        construction_error = self._construct(builder_cls, vllm_config)
        details.update(calls=[call["shown"] for call in self.calls], construction_error=construction_error)
        if not self.calls:
            if construction_error:
                raise Unjudgeable(f"AiterMLAMetadataBuilder failed before sizing metadata: {construction_error}")
            return _result("good", "code path absent: AiterMLAMetadataBuilder sized no persistent metadata "
                                   "for this configuration", details)
        self._check_sizing_inputs()
        kernel_q, decision_modules = self._decode_query_dtype(module)
        self._check_sizing_path_modules(builder_cls, decision_modules)
        judgements = [self._judge(call, kernel_q) for call in self.calls]
        chosen = next((j for j in judgements if j.verdict == "bad"), judgements[0])
        details.update(chosen.details)
        failed = self._failed_after_sizing(builder_cls, construction_error) if construction_error else ""
        return _result(chosen.verdict, chosen.reason + failed, details)

    # --- AITER ---

    def _aiter_sizing(self, root: Path):
        """AITER's own get_mla_metadata_info_v1, loaded from its source at root."""
        defining = [path for path in sorted((root / "aiter").rglob("*.py"))
                    if f"def {METADATA_CALL}(" in path.read_text(errors="replace")]
        if not defining:
            raise Unjudgeable(f"{self.label} defines no {METADATA_CALL}")
        name = ".".join(defining[0].relative_to(root).with_suffix("").parts)
        function = getattr(importlib.import_module(name), METADATA_CALL, None)
        if not inspect.isfunction(function) or function.__module__ != name:
            failure = self.importer.failures.get(name, "not defined after loading")
            raise Unjudgeable(f"cannot load {METADATA_CALL} from {self.label} ({name}): {failure}")
        self.details["aiter"] = {**self.details["aiter"], "module": name}
        self._check_aiter_path(function)
        return function

    def _check_aiter_path(self, function) -> None:
        """Skip unless every global the sizing function (and the module functions it calls) reads is real,
        and AITER's dtypes module and what it imports loaded."""
        from scenarios.aiter_mla_probe.loader import is_placeholder
        pending, seen = [function], set()
        while pending:
            current = pending.pop()
            if current.__code__ in seen:
                continue
            seen.add(current.__code__)
            for name in _global_names(current.__code__):
                if name not in current.__globals__ and not hasattr(builtins, name):
                    raise Unjudgeable(f"{METADATA_CALL} of {self.label} reads {name}, which did not load")
                value = current.__globals__.get(name)
                if is_placeholder(value):
                    raise Unjudgeable(f"{METADATA_CALL} of {self.label} reads {name}={value!r}: a value the "
                                      f"probe made up ({self._aiter_failures() or 'no module failed'})")
                if inspect.isfunction(value) and value.__module__ == function.__module__:
                    pending.append(value)
        dtypes = sys.modules["aiter"].dtypes
        on_path = {dtypes.__name__, *_imported_modules(dtypes)}
        failed = sorted(set(self.importer.failures) & on_path)
        if failed:
            raise Unjudgeable(f"{failed[0]} of {self.label} failed to load ({self.importer.failures[failed[0]]}) "
                              f"and defines AITER's dtypes")

    def _aiter_failures(self) -> str:
        return "; ".join(f"{name}: {why}" for name, why in self.importer.failures.items() if name.startswith("aiter"))

    # --- the sizing call ---

    def _recording_sizing(self):
        """get_mla_metadata_info_v1 as the checkout sees it: records each call's bound arguments, the
        caller and how many placeholder decisions came before it; refuses arguments it cannot trust."""
        def get_mla_metadata_info_v1(*args, **kwargs):
            try:
                bound = inspect.signature(self.sizing).bind(*args, **kwargs)
            except TypeError as exc:
                raise Unjudgeable(f"{METADATA_CALL} called with arguments AITER does not take: {exc}") from None
            bound.apply_defaults()
            call = {"bound": bound, "arguments": dict(bound.arguments),
                    "caller": sys._getframe(1).f_code.co_filename,
                    "decisions_before": len(self.placeholders.decisions), "made_before": len(self.placeholders.made),
                    "shown": {name: _shown(value) for name, value in bound.arguments.items()}}
            self.calls.append(call)
            return self.sizing(*bound.args, **bound.kwargs)
        return get_mla_metadata_info_v1

    def _construct(self, builder_cls, vllm_config) -> str | None:
        """Build the metadata builder, logging placeholders; the exception it raised, if any."""
        env = self.env
        self.placeholders.start()
        try:
            builder_cls(env.kv_cache_spec(self.config), [env.LAYER_NAME], vllm_config, _cpu())
            return None
        except Exception as exc:  # judged below if the metadata was sized before the failure
            traceback.print_exc()
            self.failure = exc
            return f"{type(exc).__name__}: {exc}"
        finally:
            self.placeholders.stop()
            self.made = list(self.placeholders.made)
            self.details["placeholders_touched"] = self.made[:LISTED]
            self.decisions = list(self.placeholders.decisions)

    def _failed_after_sizing(self, builder_cls, error: str) -> str:
        """The builder raised after sizing the metadata: why the verdict stands, to add to its reason, or
        Unjudgeable when code it had left to run (past where each of its frames stopped) sizes the metadata
        again: the sizing seen may then not be the one it keeps."""
        assert self.failure is not None, "called only when the construction raised"
        tb, where, function = self.failure.__traceback__, "", ""
        while tb is not None:
            code, frame = tb.tb_frame.f_code, tb.tb_frame
            if Path(code.co_filename).is_relative_to(self.checkout):
                where, function = f"{_relative(code.co_filename, self.checkout)}:{tb.tb_lineno}", code.co_name
                if _sizes_metadata(_names(code, after=tb.tb_lasti), builder_cls, frame.f_globals, set()):
                    raise Unjudgeable(f"AiterMLAMetadataBuilder raised {error} in {function} ({where}) after "
                                      f"sizing the metadata, and code it had left to run ({code.co_name}) sizes it "
                                      f"again: the sizing seen may not be the one it keeps")
            tb = tb.tb_next
        made = self.made[self.calls[-1]["made_before"]:]
        on = f", on {', '.join(made[-3:])} (values the probe made up)" if made else ""
        return (f"; AiterMLAMetadataBuilder then raised {error} in {function} ({where}){on}, after sizing the "
                f"decode metadata: nothing it had left to run sizes it again, so the verdict stands")

    def _check_sizing_inputs(self) -> None:
        """Skip unless every sizing argument is a real value and no placeholder decided a branch in the
        sizing code before the call."""
        import torch

        from scenarios.aiter_mla_probe.loader import is_placeholder
        for call in self.calls:
            arguments = call["arguments"]
            for name, value in arguments.items():
                if is_placeholder(value):
                    raise Unjudgeable(f"{METADATA_CALL} got {name}={value!r}: a value the probe made up, "
                                      f"not the checkout's")
            for name in DTYPE_ARGUMENTS:
                if not isinstance(arguments.get(name), torch.dtype):
                    raise Unjudgeable(f"{METADATA_CALL} got {name}={arguments.get(name)!r}, not a torch.dtype")
            for name in SIZE_ARGUMENTS:
                value = arguments.get(name)
                if not isinstance(value, int) or isinstance(value, bool):
                    raise Unjudgeable(f"{METADATA_CALL} got {name}={value!r}, not an int")
            for name in FLAG_ARGUMENTS:
                if name in arguments and not isinstance(arguments[name], bool):
                    raise Unjudgeable(f"{METADATA_CALL} got {name}={arguments[name]!r}, not a bool")
            sizing_files = {call["caller"], str(self.checkout / TARGET_FILE)}
            for decision in self.decisions[:call["decisions_before"]]:
                if decision.file in sizing_files:
                    raise Unjudgeable(f"the builder branched on {decision.origin}, a value the probe made up "
                                      f"({_relative(decision.file, self.checkout)}:{decision.line}), before "
                                      f"sizing the metadata")

    # --- the decode kernel's query dtype: the checkout's own decision ---

    def _decode_query_dtype(self, module):
        """The dtype the MLA layer hands the decode kernel: fp8 where its `fp8 attention and
        impl.supports_quant_query_input` test, executed with the checkout's AiterMLAImpl, says so."""
        impl_cls = getattr(module, "AiterMLAImpl", None)
        if not _is_real_class(impl_cls):
            raise Unjudgeable(f"cannot decide the decode query dtype: {TARGET_FILE} defines no loadable "
                              f"AiterMLAImpl")
        self.placeholders.start()
        try:
            impl = impl_cls(**self.env.impl_arguments(self.config))
        except Exception as exc:
            traceback.print_exc()
            raise Unjudgeable(f"cannot decide the decode query dtype: AiterMLAImpl(...) raised "
                              f"{type(exc).__name__}: {exc}") from None
        finally:
            self.placeholders.stop()
        decision_module, function, test = _quantization_decision(impl_cls)
        where = f"{_relative(decision_module.__file__, self.checkout)}:{test.lineno}"
        layer = _Layer(impl=impl, kv_cache_dtype=self.config.kv_cache_dtype)
        quantizes = self._evaluate(decision_module, function, test, layer, where)
        kernel_q = self.platform.fp8_dtype() if quantizes else self.env.MODEL_DTYPE
        self.details.update(quant_query_input=quantizes,
                            quant_query_input_source=f"{where}: {ast.unparse(test)}")
        return kernel_q, {decision_module.__name__, *_class_modules(impl_cls)}

    def _evaluate(self, module, function: ast.FunctionDef, test: ast.expr, layer, where: str) -> bool:
        """Run the decision's test and the assignments it reads, in the checkout module's namespace."""
        namespace = dict(vars(module), self=layer)
        assignments = _assignments_read(function, test)
        self.placeholders.start()
        try:
            for name, value in assignments:
                namespace[name] = _eval(value, module.__file__, namespace)
            result = _eval(test, module.__file__, namespace)
        except Exception as exc:
            raise Unjudgeable(f"cannot execute the MLA layer's query decision `{ast.unparse(test)}` ({where}): "
                              f"{type(exc).__name__}: {exc}") from None
        finally:
            self.placeholders.stop()
        if self.placeholders.decisions or not isinstance(result, bool):
            unknown = (self.placeholders.decisions[0].origin if self.placeholders.decisions else
                       getattr(result, "_origin", repr(result)))
            raise Unjudgeable(f"the MLA layer's query decision `{ast.unparse(test)}` ({where}) depends on "
                              f"{unknown}, a value the probe made up")
        return result

    def _check_sizing_path_modules(self, builder_cls, decision_modules: set[str]) -> None:
        on_path = {TARGET_MODULE, *_class_modules(builder_cls), *decision_modules}
        if not self.details["platform"].startswith("hand-written"):
            on_path.add(PLATFORM_MODULE)
        failed = sorted(set(self.importer.failures) & on_path)
        if failed:
            raise Unjudgeable(f"{failed[0]} failed to load ({self.importer.failures[failed[0]]}) and lies on "
                              f"the sizing path")

    # --- the verdict ---

    def _judge(self, call: dict, kernel_q):
        bound, arguments = call["bound"], call["arguments"]
        sized = self._size(bound)
        bound.arguments["q_dtype"] = kernel_q
        kernel = self._size(bound)
        names = {"sized_q_dtype": self._dtype_name(arguments["q_dtype"]),
                 "kernel_q_dtype": self._dtype_name(kernel_q), "kv_dtype": self._dtype_name(arguments["kv_dtype"])}
        return judge(self.config, arguments, names, arguments["q_dtype"] == kernel_q, sized, kernel, self.label)

    def _size(self, bound) -> tuple:
        """The sizing function's answer for bound arguments; skip when it leans on a made-up value."""
        self.placeholders.start()
        try:
            answer = self.sizing(*bound.args, **bound.kwargs)
        except Exception as exc:
            raise Unjudgeable(f"{METADATA_CALL} of {self.label} raised {type(exc).__name__}: {exc}") from None
        finally:
            self.placeholders.stop()
        if self.placeholders.decisions:
            decision = self.placeholders.decisions[0]
            raise Unjudgeable(f"{METADATA_CALL} of {self.label} branched on {decision.origin}, a value the probe "
                              f"made up ({Path(decision.file).name}:{decision.line})")
        shapes = _shapes(answer)
        if not all(isinstance(size, int) and not isinstance(size, bool) for shape, _ in shapes for size in shape):
            raise Unjudgeable(f"{METADATA_CALL} of {self.label} returned shapes that are not ints: {shapes}")
        return shapes

    def _dtype_name(self, dtype) -> str:
        """"fp8" for the platform's fp8 (what AITER calls dtypes.fp8 there), else the env's short name."""
        return "fp8" if dtype == self.platform.fp8_dtype() else self.env.dtype_name(dtype)


class _Layer:
    """The MLA layer as its query decision reads it: the impl and the KV cache dtype, nothing else."""

    def __init__(self, impl, kv_cache_dtype: str):
        self.impl, self.kv_cache_dtype = impl, kv_cache_dtype


def _quantization_decision(impl_cls):
    """(module, function, test) of the `if` that quantizes the decode query: its test reads
    `supports_quant_query_input` and its body calls a quantizing op. Searched in the modules of the
    impl's classes (the MLA layer lives beside MLACommonImpl)."""
    for module_name in _class_modules(impl_cls):
        module = sys.modules.get(module_name)
        source_file = getattr(module, "__file__", None)
        if not source_file or not module_name.startswith("vllm"):
            continue
        tree = ast.parse(Path(source_file).read_bytes(), source_file)
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.If) and _reads_flag(node.test) and _calls_quant(node.body):
                    return module, function, node.test
    raise Unjudgeable(f"cannot decide the decode query dtype: no `if ... {QUANT_QUERY_FLAG}` that quantizes the "
                      f"query in the modules of {impl_cls.__name__}'s classes")


def _reads_flag(test: ast.expr) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == QUANT_QUERY_FLAG for node in ast.walk(test))


def _calls_quant(body: list[ast.stmt]) -> bool:
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if "quant" in name:
                    return True
    return False


def _assignments_read(function: ast.FunctionDef, test: ast.expr) -> list[tuple[str, ast.expr]]:
    """For each local name the test reads: its last plain assignment before the test, in source order."""
    names = {node.id for node in ast.walk(test) if isinstance(node, ast.Name) and node.id != "self"}
    found: dict[str, ast.Assign] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and node.lineno < test.lineno and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            if node.targets[0].id not in found or found[node.targets[0].id].lineno < node.lineno:
                found[node.targets[0].id] = node
    return [(name, node.value) for name, node in sorted(found.items(), key=lambda item: item[1].lineno)]


def _global_names(code) -> set[str]:
    """Global names a code object (and the code objects nested in it) reads."""
    names = {instruction.argval for instruction in dis.get_instructions(code)
             if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for constant in code.co_consts:
        if inspect.iscode(constant):
            names |= _global_names(constant)
    return names


def _names(code, after: int = -1) -> set[str]:
    """The names (and string constants) code's instructions past offset `after` use, with every name of the code
    objects those instructions load (a lambda, a comprehension)."""
    names: set[str] = set()
    for instruction in dis.get_instructions(code):
        if instruction.offset <= after:
            continue
        if isinstance(instruction.argval, str):
            names.add(instruction.argval)
        elif inspect.iscode(instruction.argval):
            names |= _names(instruction.argval)
    return names


def _sizes_metadata(names: set[str], owner, namespace: dict, seen: set[str]) -> bool:
    """Whether names name the sizing call, or a method of owner (the builder class) or a function of namespace
    (a module's globals) whose code does, through any depth of such calls."""
    if METADATA_CALL in names:
        return True
    for name in sorted(names - seen):
        seen.add(name)
        found = getattr(owner, name, None) or namespace.get(name)  # a placeholder is no function: not followed
        wrapped = getattr(found, "__wrapped__", None) if inspect.isfunction(found) else None  # functools.wraps
        for target in (found, wrapped):
            if inspect.isfunction(target) and _sizes_metadata(_names(target.__code__), owner, target.__globals__,
                                                              seen):
                return True
    return False


def _imported_modules(module) -> set[str]:
    """The modules module's source imports from (relative imports resolved)."""
    found = set()
    package = module.__name__.rpartition(".")[0] if not hasattr(module, "__path__") else module.__name__
    for node in ast.walk(ast.parse(Path(module.__file__).read_bytes())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            found.add(".".join(filter(None, [base, node.module])))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _eval(expression: ast.expr, filename: str, namespace: dict):
    return eval(compile(ast.Expression(expression), filename, "eval"), namespace)  # noqa: S307


def _class_modules(cls) -> list[str]:
    return list(dict.fromkeys(klass.__module__ for klass in getattr(cls, "__mro__", ())
                              if klass.__module__.startswith("vllm")))


def _shapes(info) -> tuple:
    """AITER's (shape, dtype) pairs with every shape a tuple of ints (AITER writes `(2)` for `(2,)`)."""
    return tuple((tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), str(dtype))
                 for shape, dtype in info)


def _shown(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value) if not hasattr(value, "_origin") else repr(value)


def _relative(path: str, checkout: Path) -> str:
    try:
        return str(Path(path).relative_to(checkout))
    except ValueError:
        return path


def _cpu():
    import torch
    return torch.device("cpu")


def _is_real_class(obj: object) -> TypeGuard[type[Any]]:
    """A class the checkout's code defines (not a placeholder the probe made)."""
    return isinstance(obj, type) and not obj.__dict__.get("_is_placeholder")


def _result(verdict: str, reason: str, details: dict | None = None) -> dict:
    return {"verdict": verdict, "reason": reason, "details": details or {}}


def main(argv: list[str]) -> int:
    checkout, config_json, aiter_json = argv
    start = time.monotonic()
    result = probe(Path(checkout).resolve(), ProbeConfig(**json.loads(config_json)), json.loads(aiter_json))
    result["details"]["child_seconds"] = round(time.monotonic() - start, 3)
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
