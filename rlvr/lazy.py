"""Heavy libraries (torch, transformers, peft, tokenizers, the Tinker SDK) imported on first use.

Checking a config builds every light component from its `_target_`, so their modules are imported before
any model loads. Importing torch and transformers costs ~6 s of CPU on a 2-core machine; a wrong invocation
(`python train.py backend=tinker` without `$TINKER_API_KEY`, `transform.beta=-1`) must not pay it, and a
process that only composes and submits a sweep must stay light. So library modules bind these names with
`torch = lazy_import("torch")`: the real import happens the first time an attribute is read (inside a
function, at run time), after which the proxy holds the module's attributes and costs nothing more. Names
used only in annotations are imported under `TYPE_CHECKING`. `tests/test_errors.py` checks that a
config error leaves torch and transformers unimported; `tests/test_startup_imports.py` that the default run's
modules leave unimported what the default run never uses.

The real import runs with Python's cyclic garbage collector paused (`collector_paused`): importing torch,
transformers and PEFT makes ~600,000 objects that live as long as the process, and each collection their
allocation set off walked the ones made so far, the full ones all of them. The default run spent 0.7 s of its
start-up collecting so, 0.05 s with the pauses (`CollectorPause`; `python -m bench.startup` times the start-up). A
library imported by a plain `import` inside a function (rlvr/requirements.py's torch) goes through `import_paused`
for the same reason.
"""

from __future__ import annotations

import functools
import gc
import importlib
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class LazyModule(ModuleType):
    """Stands for the module `__name__` until an attribute is read, then imports it and mirrors it."""

    def __getattr__(self, attr: str):
        real = import_paused(self.__name__)
        self.__dict__.update(vars(real))
        # From now on a read is a plain module's dict lookup (this class's __getattr__ made each one ~2.5x
        # slower); what the real module gains later (torch.distributed, …) is found through a module-level
        # __getattr__ (PEP 562).
        self.__dict__["__getattr__"] = functools.partial(late_attribute, real)
        self.__class__ = LoadedModule  # type: ignore[assignment]  # a swap to a sibling class, which mypy cannot model
        return late_attribute(real, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


class LoadedModule(ModuleType):
    """A `LazyModule` whose module has been imported."""

    def __repr__(self) -> str:
        return f"<loaded lazy module {self.__name__!r}>"


class CollectorPause:
    """Pauses of the cyclic garbage collector, which may overlap (a library imported in a worker thread while
    another imports in the main one): the collector is off from the first pause to the end of the last, then as
    it was before the first. If modules were imported meanwhile, what is alive then is moved out of the collector's
    sight (`gc.freeze()`) first: a library's modules, classes and functions live as long as the process, and
    otherwise the next collections would walk them all once more (~0.3 s of the default run's start-up). `fit`
    freezes the whole start-up heap before its first step anyway and gives it all back when the run ends
    (`gc.unfreeze()`, rlvr/trainer.py); cyclic garbage frozen with them waits until then."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False
        self._modules = 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._was_enabled, self._modules = gc.isenabled(), len(sys.modules)
                gc.disable()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._was_enabled:
                    if len(sys.modules) > self._modules:
                        gc.freeze()
                    gc.enable()


collector_paused = CollectorPause()
"""`with collector_paused():` runs its body with the cyclic garbage collector off (reference counting still frees
what is not cyclic; the next collection after the pause finds any cycle made during it)."""


def import_paused(name: str) -> ModuleType:
    """`importlib.import_module(name)` with the cyclic garbage collector paused (the module docstring says why)."""
    module = sys.modules.get(name)
    if module is not None and not getattr(module.__spec__, "_initializing", False):
        return module  # imported already: nothing to pause for
    # absent, or half-initialised by another thread: import_module waits on the module's import lock for it
    with collector_paused():
        return importlib.import_module(name)


_MISSING = object()


def late_attribute(real: ModuleType, name: str) -> Any:
    """`real.name` for a loaded `LazyModule`: an attribute its module gained after the proxy copied it, or one the
    module imports on first read (transformers' `LlamaForCausalLM` imports its modelling then), which imports with
    the collector paused."""
    found = vars(real).get(name, _MISSING)
    if found is not _MISSING:
        return found
    with collector_paused():
        return getattr(real, name)


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
