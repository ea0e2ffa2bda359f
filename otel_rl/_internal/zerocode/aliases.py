"""Serve otel_rl's facades under the import names of the timer modules they replace.

With `install()`, ``import mlagents_envs.timers`` (in any spelling: ``from ... import timed``,
``import ... as t``, or a library importing it internally) binds `otel_rl.timers`, and
``sample_factory.utils.timing`` binds `otel_rl.timing`: one module object under two names, so
``sys.modules["mlagents_envs.timers"] is otel_rl.timers``. Only the leaf module is served; its
parent package is imported as usual, so when ``mlagents_envs`` is not installed importing
``mlagents_envs.timers`` still fails as it would without otel_rl.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

__all__ = ["ALIASES", "AliasFinder", "install", "uninstall"]

logger = logging.getLogger("otel_rl")

#: Module name as user code imports it -> the otel_rl module served under that name.
ALIASES: Mapping[str, str] = {
    "mlagents_envs.timers": "otel_rl.timers",
    "sample_factory.utils.timing": "otel_rl.timing",
}


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system an already imported module instead of executing a file."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module
        self._own_spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self._module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just set module.__spec__ to the alias's spec; give the module
        # back its own, so that reload(), pickling by reference and tools reading __spec__ see
        # otel_rl's module as it is.
        module.__spec__ = self._own_spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """A `sys.meta_path` finder that serves each aliased name with its otel_rl module."""

    def __init__(self, aliases: Mapping[str, str]) -> None:
        self.aliases = dict(aliases)
        self._failed: set[str] = set()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        target_name = self.aliases.get(fullname)
        if target_name is None or target_name in self._failed:
            return None
        try:
            module = importlib.import_module(target_name)
        except Exception as exc:
            # Fail open: the original module loads as if otel_rl were not there.
            self._failed.add(target_name)
            logger.warning(
                "otel_rl: cannot serve %s with %s (%s: %s); using the original module",
                fullname,
                target_name,
                type(exc).__name__,
                exc,
            )
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module))


def _installed() -> AliasFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, AliasFinder)), None)


def install(aliases: Mapping[str, str] = ALIASES) -> AliasFinder:
    """Put the alias finder first on `sys.meta_path` (once; later calls return the same one).

    A name already imported before this call keeps its original module: swapping it now would
    leave two different modules in use in one process.
    """
    finder = _installed()
    if finder is None:
        finder = AliasFinder(aliases)
        sys.meta_path.insert(0, finder)
    for name, target in aliases.items():
        existing = sys.modules.get(name)
        if existing is not None and existing.__name__ != target:
            logger.warning(
                "otel_rl: %s was imported before otel_rl's aliases were installed; "
                "its timers are not served by otel_rl in this process",
                name,
            )
    return finder


def uninstall() -> None:
    """Remove the alias finder; modules already imported under an alias stay as they are."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, AliasFinder)]
