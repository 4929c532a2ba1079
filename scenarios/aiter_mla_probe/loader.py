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
import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Callable, Mapping

StandIn = Callable[[types.ModuleType], None]  # fills a stand-in module's attributes


def is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _is_decoration(args: tuple, kwargs: dict) -> bool:
    """A call that looks like `@placeholder` applied to a function or class."""
    return len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or isinstance(args[0], type))


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
        return iter(())

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_is_placeholder") and _is_decoration(args, kwargs):
            return args[0]
        return super().__call__(*args, **kwargs)


class Placeholder(metaclass=_PlaceholderMeta):
    """A permissive stand-in value: falsy, empty, callable; every attribute is another placeholder."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name: str):
        if is_dunder(name):
            raise AttributeError(name)
        return Placeholder()

    def __call__(self, *args, **kwargs):
        return args[0] if _is_decoration(args, kwargs) else Placeholder()

    def __getitem__(self, key):
        return Placeholder()

    def __bool__(self) -> bool:
        return False

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<placeholder {type(self).__qualname__}>"


def placeholder_class(qualname: str, module: str) -> type:
    """A fresh placeholder class named qualname: subclassable, callable, usable as a decorator."""
    name = qualname.rpartition(".")[2]
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
    module.__getattr__ = lambda name: _missing_attribute(module, name)


def available_top_levels() -> set[str]:
    """Top-level modules the probe may import for real: stdlib, what is already imported, and torch
    with its requirements (transitively, without extras)."""
    names = set(sys.stdlib_module_names) | {m.partition(".")[0] for m in sys.modules}
    pending, seen = ["torch"], set()
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
        pending += [re.match(r"[A-Za-z0-9._-]+", req).group(0)
                    for req in dist.requires or [] if "extra ==" not in req]
    return names


def _normalize(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


class SourceImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `vllm` from a checkout's source files, stand-ins and stubs for everything else."""

    def __init__(self, checkout: Path, stand_ins: Mapping[str, StandIn], available: set[str]):
        self.checkout = Path(checkout)
        self.stand_ins = dict(stand_ins)
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
        if top == "vllm":
            return self._source_spec(fullname) or self._spec(fullname, "stub")
        if top in self.available:
            return None
        return self._spec(fullname, "stub")

    def _stand_in(self, fullname: str) -> str | None:
        """The stand-in prefix that owns fullname, if any."""
        for prefix in self.stand_ins:
            if fullname == prefix or fullname.startswith(prefix + "."):
                return prefix
        return None

    def _source_spec(self, fullname: str):
        base = self.checkout.joinpath(*fullname.split("."))
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

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        spec = module.__spec__
        if spec.loader_state == "stand-in":
            self.stand_ins[self._stand_in(spec.name)](module)
        elif spec.loader_state == "stub":
            self.stubbed.append(spec.name)
        elif spec.origin is not None:
            try:
                code = compile(Path(spec.origin).read_bytes(), spec.origin, "exec", dont_inherit=True)
                exec(code, module.__dict__)
                return
            except Exception as exc:  # the checkout's code cannot run here: keep what it defined
                self.failures[spec.name] = f"{type(exc).__name__}: {exc}"
        else:
            return  # a source directory without __init__.py: a namespace package
        make_permissive(module)
