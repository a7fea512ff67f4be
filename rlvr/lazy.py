"""Heavy libraries (torch, transformers, peft, tokenizers, the Tinker SDK) imported on first use.

Checking a config builds every light component from its `_target_`, so their modules are imported before
any model loads. Importing torch and transformers costs ~6 s of CPU on a 2-core machine; a wrong invocation
(`python train.py backend=tinker` without `$TINKER_API_KEY`, `transform.beta=-1`) must not pay it, and a
process that only composes and submits a sweep must stay light. So library modules bind these names with
`torch = lazy_import("torch")`: the real import happens the first time an attribute is read (inside a
function, at run time), after which the proxy holds the module's attributes and costs nothing more. Names
used only in annotations are imported under `TYPE_CHECKING`. `tests/test_errors.py` checks that a
config error leaves torch and transformers unimported.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class LazyModule(ModuleType):
    """Stands for the module `__name__` until an attribute is read, then imports it and mirrors it."""

    def __getattr__(self, attr: str):
        real = importlib.import_module(self.__name__)
        self.__dict__.update(vars(real))
        # From now on a read is a plain module's dict lookup (this class's __getattr__ made each one ~2.5x
        # slower); what the real module gains later (torch.distributed, …) is found through a module-level
        # __getattr__ (PEP 562).
        self.__dict__["__getattr__"] = lambda name: getattr(real, name)
        self.__class__ = LoadedModule  # type: ignore[assignment]  # a swap to a sibling class, which mypy cannot model
        return getattr(real, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


class LoadedModule(ModuleType):
    """A `LazyModule` whose module has been imported."""

    def __repr__(self) -> str:
        return f"<loaded lazy module {self.__name__!r}>"


def lazy_import(name: str) -> ModuleType:
    """A stand-in for `import name` that imports on first attribute access."""
    return LazyModule(name)


def no_grad(fn: Callable[P, R]) -> Callable[P, R]:
    """`@torch.no_grad()` for a method, without importing torch when the class is defined."""

    @functools.wraps(fn)
    def without_grad(*args: P.args, **kwargs: P.kwargs) -> R:
        with torch.no_grad():
            return fn(*args, **kwargs)

    return without_grad


torch = lazy_import("torch")
