"""Training scalars with no code change: what a program writes to TensorBoard becomes metrics.

Under `otel-rl run`, `install()` puts a finder on `sys.meta_path` that, when one of these
modules is imported, lets the module load as usual and then wraps one method:

- ``torch.utils.tensorboard.writer.SummaryWriter.add_scalar`` (ML-Agents' TensorboardWriter);
- ``tensorboardX.writer.SummaryWriter.add_scalar`` (Sample Factory);
- ML-Agents' ``mlagents.trainers.stats.StatsReporter``: a `StatsWriter` of otel_rl's is added
  with ``StatsReporter.add_writer`` (its documented extension point).

The wrapper calls the original first, with the same arguments, and only then records
``(category, tag) -> (value, step)`` (`metrics.record_scalar`): the event files are what they
would be without otel_rl. The category is the writer's folder name (Sample Factory's policy
id, ML-Agents' behavior name, which is also StatsReporter's category, so both sources of an
ML-Agents stat land in one series). Recording never raises into the program.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["install", "patch_module"]

_MARK = "_otel_rl_scalars"


def _record(tag: Any, value: Any, step: Any, category: str) -> None:
    from otel_rl._internal.metrics import record_scalar

    try:
        number = value.item() if hasattr(value, "item") else value
        record_scalar(str(tag), float(number), None if step is None else int(step), category)
    except Exception:
        pass


def _wrap_add_scalar(cls: Any, logdir_attr: str) -> None:
    original = cls.add_scalar
    if getattr(original, _MARK, False):
        return

    def add_scalar(self: Any, tag: Any, scalar_value: Any, global_step: Any = None,
                   *args: Any, **kwargs: Any) -> Any:
        result = original(self, tag, scalar_value, global_step, *args, **kwargs)
        try:
            category = os.path.basename(str(getattr(self, logdir_attr, "") or "").rstrip("/"))
        except Exception:
            category = ""
        _record(tag, scalar_value, global_step, category)
        return result

    add_scalar.__name__ = original.__name__
    add_scalar.__qualname__ = original.__qualname__
    add_scalar.__doc__ = original.__doc__
    add_scalar.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(add_scalar, _MARK, True)
    cls.add_scalar = add_scalar


def _patch_stats(module: ModuleType) -> None:
    reporter = getattr(module, "StatsReporter", None)
    base = getattr(module, "StatsWriter", None)
    if reporter is None or base is None or getattr(reporter, _MARK, False):
        return

    class OtelRlStatsWriter(base):  # type: ignore[misc, valid-type]
        """ML-Agents stats as otel_rl scalars (category: the behavior name)."""

        def write_stats(self, category: str, values: Any, step: int) -> None:
            for key, summary in values.items():
                try:
                    value = summary.aggregated_value
                except Exception:
                    continue
                _record(key, value, step, category)

    reporter.add_writer(OtelRlStatsWriter())
    setattr(reporter, _MARK, True)


#: Module name -> what to patch in it once it has been executed.
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "torch.utils.tensorboard.writer":
        lambda m: _wrap_add_scalar(m.SummaryWriter, "log_dir"),
    "tensorboardX.writer": lambda m: _wrap_add_scalar(m.SummaryWriter, "logdir"),
    "mlagents.trainers.stats": _patch_stats,
}


def patch_module(name: str, module: ModuleType) -> None:
    """Apply the patch for `name` to `module` (fail open: a program never breaks for it)."""
    try:
        PATCHES[name](module)
    except Exception as exc:
        sys.stderr.write(f"otel-rl run: cannot record scalars from {name} "
                         f"({type(exc).__name__}: {exc}); continuing\n")


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # The module's own loader back on its spec: tools reading __spec__ see the real one.
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        patch_module(self._name, module)


class ScalarFinder(importlib.abc.MetaPathFinder):
    """Finds the patched modules through the other finders and wraps their loader."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, ScalarFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec  # type: ignore[no-any-return]
        return None


def install() -> None:
    """Patch the scalar writers when (or if already) imported; idempotent."""
    if not any(isinstance(f, ScalarFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ScalarFinder())
    for name in PATCHES:
        module = sys.modules.get(name)
        if module is not None:
            patch_module(name, module)
