"""Source-only import of a vLLM checkout: the checkout's own code where it runs, stand-ins where it can't.

An `SourceImporter` on `sys.meta_path` serves three kinds of module:
- `vllm.*` with a source file in the checkout: executed from that file. If execution raises, the
  module keeps what it defined so far and answers every other name with a placeholder.
- stand-ins (the probe's environment: `aiter`, `vllm.platforms`, ...): modules whose attributes the
  probe provides; any other name is a placeholder.
- anything that is neither in the checkout nor available (stdlib, torch and torch's own requirements):
  a stub module of placeholders. vLLM's other dependencies are never imported, installed or not, so
  the probe judges the same way on every machine.
"""
from __future__ import annotations

import abc
import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping

StandIn = Callable[[types.ModuleType], None]  # fills a stand-in module's attributes


def is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _is_decoration(args: tuple, kwargs: dict) -> bool:
    """A call that looks like `@placeholder` applied to a function or class."""
    return len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or isinstance(args[0], type))


@dataclass(frozen=True)
class Decision:
    """A placeholder whose truth or equality was asked: code branched on a value the probe made up."""

    origin: str
    file: str
    line: int


class PlaceholderLog:
    """While recording: the placeholders made, and the decisions taken on any placeholder."""

    def __init__(self):
        self.recording = False
        self.made: dict[str, None] = {}  # origins, in order, once each
        self.decisions: list[Decision] = []

    def start(self) -> None:
        self.made.clear()
        self.decisions.clear()
        self.recording = True

    def stop(self) -> None:
        self.recording = False

    def note_made(self, origin: str) -> None:
        if self.recording:
            self.made.setdefault(origin)

    def note_decision(self, origin: str, frame) -> None:
        if self.recording:
            self.decisions.append(Decision(origin, frame.f_code.co_filename, frame.f_lineno))


PLACEHOLDERS = PlaceholderLog()


class _PlaceholderMeta(abc.ABCMeta):
    """Placeholder classes: any class attribute, subscript or bare decoration is accepted."""

    def __getattr__(cls, name: str):
        if is_dunder(name):
            raise AttributeError(name)
        value = placeholder_class(f"{cls.__qualname__}.{name}", cls.__module__)
        setattr(cls, name, value)
        return value

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        if cls.__dict__.get("_is_placeholder"):
            PLACEHOLDERS.note_decision(f"{cls.__module__}.{cls.__qualname__}", sys._getframe(1))
        return iter(())

    def __bool__(cls) -> bool:
        if cls.__dict__.get("_is_placeholder"):
            PLACEHOLDERS.note_decision(f"{cls.__module__}.{cls.__qualname__}", sys._getframe(1))
        return True

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_is_placeholder"):
            if _is_decoration(args, kwargs):
                return args[0]
            instance = super().__call__(*args, **kwargs)
            return named(instance, f"{cls.__module__}.{cls.__qualname__}()")
        return super().__call__(*args, **kwargs)


class Placeholder(metaclass=_PlaceholderMeta):
    """A permissive stand-in value: falsy, empty, callable; every attribute is another placeholder.

    Each one knows its origin (e.g. `vllm_config.model_config.no_such_attribute`), so a verdict that it
    reaches can name what the probe did not know; truth tests and comparisons are logged as decisions.
    """

    _origin = "placeholder"

    def __init_subclass__(cls, **kwargs):
        cls._origin = f"{cls.__module__}.{cls.__qualname__}"

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name: str):
        if is_dunder(name):
            raise AttributeError(name)
        return named(Placeholder(), f"{self._origin}.{name}")

    def __call__(self, *args, **kwargs):
        return args[0] if _is_decoration(args, kwargs) else named(Placeholder(), f"{self._origin}()")

    def __getitem__(self, key):
        return named(Placeholder(), f"{self._origin}[...]")

    def __bool__(self) -> bool:
        PLACEHOLDERS.note_decision(self._origin, sys._getframe(1))
        return False

    def __eq__(self, other):
        PLACEHOLDERS.note_decision(self._origin, sys._getframe(1))
        return self is other

    def __ne__(self, other):
        PLACEHOLDERS.note_decision(self._origin, sys._getframe(1))
        return self is not other

    __hash__ = object.__hash__

    def __iter__(self):
        PLACEHOLDERS.note_decision(self._origin, sys._getframe(1))
        return iter(())

    def __len__(self) -> int:
        PLACEHOLDERS.note_decision(self._origin, sys._getframe(1))
        return 0

    def __contains__(self, item) -> bool:
        PLACEHOLDERS.note_decision(self._origin, sys._getframe(1))
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return f"<placeholder {self._origin}>"


def named(value: Placeholder, origin: str) -> Placeholder:
    """value, labelled with where it came from (and logged as made)."""
    object.__setattr__(value, "_origin", origin)
    PLACEHOLDERS.note_made(origin)
    return value


def is_placeholder(value) -> bool:
    """A placeholder instance or placeholder class."""
    return isinstance(value, Placeholder) or (isinstance(value, type) and
                                              bool(value.__dict__.get("_is_placeholder")))


def placeholder_class(qualname: str, module: str) -> type:
    """A fresh placeholder class named qualname: subclassable, callable, usable as a decorator."""
    name = qualname.rpartition(".")[2]
    PLACEHOLDERS.note_made(f"{module}.{qualname}")
    return _PlaceholderMeta(name, (Placeholder,), {"__qualname__": qualname, "__module__": module,
                                                   "_is_placeholder": True})


def _missing_attribute(module: types.ModuleType, name: str):
    if is_dunder(name):
        raise AttributeError(name)
    value = placeholder_class(name, module.__name__)
    setattr(module, name, value)
    return value


def make_permissive(module: types.ModuleType) -> None:
    """Give module a PEP 562 `__getattr__` that answers unknown names with placeholder classes."""
    vars(module)["__getattr__"] = lambda name: _missing_attribute(module, name)


ALSO_REAL = ("packaging",)  # pure-Python version parsing; the probe extra installs it


def available_top_levels() -> set[str]:
    """Top-level modules the probe may import for real: stdlib, what is already imported, and torch
    and packaging with their requirements (transitively, without extras)."""
    names = set(sys.stdlib_module_names) | {m.partition(".")[0] for m in sys.modules}
    pending, seen = ["torch", *ALSO_REAL], set()
    while pending:
        name = _normalize(pending.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        names.add(name.replace("-", "_"))
        names.update((dist.read_text("top_level.txt") or "").split())
        pending += [match.group(0) for req in dist.requires or []
                    if "extra ==" not in req and (match := re.match(r"[A-Za-z0-9._-]+", req))]
    return names


def _normalize(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


class SourceImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `vllm` from a checkout's source files, stand-ins and stubs for everything else."""

    def __init__(self, checkout: Path, stand_ins: Mapping[str, StandIn], available: set[str],
                 source_below: Iterable[str] = (), other_roots: Mapping[str, Path] | None = None):
        """stand_ins own their submodules too, except what source_below names: a module, or a stand-in
        package whose submodules all load from the checkout. Such source modules get the stand-in's
        fill over them; a stand-in package named there takes the names it lacks from the submodule its
        checkout `__init__.py` imports them from. other_roots: more top-level packages served from source
        (e.g. {"aiter": AITER's source root}), like `vllm` from the checkout."""
        self.checkout = Path(checkout)
        self.roots = {"vllm": self.checkout, **{top: Path(root) for top, root in (other_roots or {}).items()}}
        self.stand_ins = dict(stand_ins)
        self.source_below = set(source_below)
        self.available = available
        self.failures: dict[str, str] = {}  # module -> exception that stopped its real source
        self.stubbed: list[str] = []  # modules answered by placeholders only

    def install(self) -> "SourceImporter":
        sys.meta_path.insert(0, self)
        return self

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if self._stand_in(fullname) is not None:
            return self._spec(fullname, "stand-in")
        if top in self.roots:
            return self._source_spec(fullname) or self._spec(fullname, "stub")
        if top in self.available:
            return None
        return self._spec(fullname, "stub")

    def _stand_in(self, fullname: str) -> str | None:
        """The stand-in prefix that owns fullname, if any."""
        owner = self._owner(fullname)
        if owner is None or fullname == owner:
            return owner
        return None if fullname in self.source_below or owner in self.source_below else owner

    def _owner(self, fullname: str) -> str | None:
        """The longest stand-in prefix fullname falls under, if any."""
        owners = [prefix for prefix in self.stand_ins if fullname == prefix or fullname.startswith(prefix + ".")]
        return max(owners, key=len, default=None)

    def _source_spec(self, fullname: str):
        base = self.roots[fullname.partition(".")[0]].joinpath(*fullname.split("."))
        if base.is_dir():
            init = base / "__init__.py"
            spec = self._spec(fullname, "source", str(init) if init.exists() else None)
            spec.submodule_search_locations = [str(base)]
            return spec
        file = base.with_suffix(".py")
        return self._spec(fullname, "source", str(file), package=False) if file.is_file() else None

    def _spec(self, fullname: str, kind: str, origin: str | None = None, package: bool = True):
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=origin, is_package=package)
        spec.loader_state = kind
        spec.has_location = origin is not None
        return spec

    def _override(self, module: types.ModuleType) -> None:
        """Apply the stand-in's fill to a source submodule of a source_below package."""
        owner = self._owner(module.__name__)
        if owner is not None:
            self.stand_ins[owner](module)

    def _reexports(self, package: types.ModuleType) -> Callable[[str], object]:
        """A PEP 562 `__getattr__` for a stand-in package: names its checkout `__init__.py` imports from
        a submodule come from that submodule, anything else is a placeholder class."""
        init = self.roots[package.__name__.partition(".")[0]].joinpath(*package.__name__.split("."), "__init__.py")
        sources: dict[str, str] = {}
        if init.is_file():
            for node in ast.walk(ast.parse(init.read_bytes())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    origin = (f"{package.__name__}.{node.module}" if node.level == 1 else
                              node.module if node.level == 0 else None)
                    if origin and origin.startswith(package.__name__ + "."):
                        sources.update({alias.asname or alias.name: origin for alias in node.names})

        def resolve(name: str):
            if name in sources:
                origin = importlib.import_module(sources[name])
                value = getattr(origin, name, None)
                if value is None:  # `from .utility import dtypes`: a submodule
                    value = importlib.import_module(f"{sources[name]}.{name}")
                setattr(package, name, value)
                return value
            return _missing_attribute(package, name)
        return resolve

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        spec = module.__spec__
        assert spec is not None, "the import system runs exec_module on the module made from our spec"
        if spec.loader_state == "stand-in":
            owner = self._stand_in(spec.name)
            assert owner is not None, "find_spec makes a stand-in spec only for a name a stand-in owns"
            self.stand_ins[owner](module)
            if spec.name in self.source_below:
                vars(module)["__getattr__"] = self._reexports(module)
                return
        elif spec.loader_state == "stub":
            self.stubbed.append(spec.name)
        elif spec.origin is not None:
            try:
                code = compile(Path(spec.origin).read_bytes(), spec.origin, "exec", dont_inherit=True)
                exec(code, module.__dict__)
                self._override(module)
                return
            except Exception as exc:  # the checkout's code cannot run here: keep what it defined
                self.failures[spec.name] = f"{type(exc).__name__}: {exc}"
        else:
            return  # a source directory without __init__.py: a namespace package
        make_permissive(module)
