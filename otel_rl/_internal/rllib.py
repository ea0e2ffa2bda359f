"""RLlib with no code change: its own timers as otel_rl blocks, its actors as roles.

RLlib (new API stack) times its work with ``MetricsLogger.log_time(key)``, a context manager
returning the `StatsBase` that holds the key's numbers (``with metrics.log_time((TIMERS,
TRAINING_ITERATION_TIMER)):``, or ``stats.__enter__()`` / ``stats.__exit__(...)`` by hand in the
connector pipelines). Patched here:

- ``MetricsLogger._set_key`` (through which a logger stores every stats object it holds:
  created by ``log_time``, aggregated, restored) names the stats object after its key, once
  (`block_name`: the key's parts without ``"timers"``, joined by ``.``:
  ``training_iteration``, ``env_runner_sampling_timer``,
  ``env_to_module_connector.connector_pipeline_timer``); where a MetricsLogger has no
  ``_set_key``, ``log_time`` names the stats object it returns instead (per call);
- ``StatsBase.__enter__`` / ``__exit__`` of a named stats object open and close an otel_rl block
  of that name around RLlib's own timing (ours outside, so RLlib's numbers do not include
  otel_rl's cost); the object, RLlib's numbers and results dict are untouched otherwise. The
  glue is compiled where the hot path is (`_hotpath.install_rllib`, statement for statement
  `_patched_enter` / `_patched_exit` below, which it falls back on), and follows the
  ``accelerator`` setting;
- where RLlib's ``StatsBase.__enter__`` / ``__exit__``, ``EmaStats.push`` and ``safe_isnan`` are
  the ones `_hotpath.rllib_stats` is written after (`OWN_SOURCES`: RLlib 2.60), the compiled glue
  calls that compiled copy of RLlib's own methods instead of RLlib's Python ones: the same
  numbers in the stats object, ~1.5 µs less a block (two numpy ``isnan`` calls on a float and
  three frames), which pays for otel_rl's block (`_patch_ema`);
- where RLlib's ``MetricsLogger.log_time`` and what it calls for a key the logger holds read as
  the ones `_hotpath.rllib_log_time` is written after (`LOG_TIME_SOURCES`: RLlib 2.60),
  ``log_time`` is that compiled copy: a held str or tuple-of-strs key is looked up once, in C
  (~0.2 µs, not RLlib's ~2.3 µs and seven Python frames); every other call (a new key, keyword
  arguments, another lock or logger class) goes to RLlib's own function (`_patch_logger`);
- a remote ``EnvRunner`` or ``Learner`` (a Ray actor of its own) names that process's role:
  ``EnvRunner`` with its ``worker_index``, ``Learner`` with its learner index, for the
  cross-worker view. The local EnvRunner and Learner, built where the Algorithm runs (the
  driver, or the actor of a Tune trial), leave that process's role alone; a local Learner's
  (``num_learners=0``, RLlib's default) ``update`` runs in a block named ``Learner``, so the
  tree keeps learning apart from sampling.

Nothing is imported or patched until RLlib's own modules are: `PATCHES` joins the modules
`propagation` patches right after they are executed (installed by `otel_rl.configure`, under
``otel-rl run``, and in every Ray worker process that joins the run). Every patch is fail-open: an error in otel_rl's part
is counted and reported once, and RLlib's call runs as without otel_rl.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from otel_rl._internal import log

__all__ = ["LOG_TIME_SOURCES", "OWN_SOURCES", "PATCHES", "block_name", "compiled_glue",
           "compiled_log_time", "compiled_own", "own_methods"]

#: RLlib's key part that only groups timers in its results dict.
_TIMERS = "timers"
#: Attribute set on a stats object by the patched `_set_key` (or `log_time`): the block's name
#: (`StatsBase` has it as None).
_NAME = "_otel_rl_block"

_open = threading.local()  # .blocks: this thread's open blocks (stats, timer), innermost last
_failed: set[str] = set()


def block_name(key: object) -> str:
    """The block name of a `log_time` key.

    >>> block_name(("timers", "env_runner_sampling_timer"))
    'env_runner_sampling_timer'
    >>> block_name(("env_to_module_connector", "timers", "connectors", "add_states"))
    'env_to_module_connector.connectors.add_states'
    >>> block_name((("learners", "default_policy"), "timers", "update"))
    'learners.default_policy.update'
    """
    parts: list[object] = []
    todo = [key]
    while todo:  # RLlib flattens nested keys the same way (`tree.flatten`)
        part = todo.pop()
        if isinstance(part, (tuple, list)):
            todo.extend(reversed(part))
        else:
            parts.append(part)
    return ".".join(str(p) for p in parts if p != _TIMERS) or _TIMERS


def _fail(where: str, exc: BaseException) -> None:
    if where not in _failed:
        _failed.add(where)
        log.warning("otel_rl: RLlib %s: %r; RLlib runs on without it", where, exc)


def _patched_set_key(original: Callable[..., Any]) -> Callable[..., Any]:
    # `_set_key(flat_key, stats)`: every stats object a logger holds is stored through it
    # (created by `log_time`/`log_value`, aggregated, restored from a state), once per object,
    # not per block: the name costs RLlib's timed blocks nothing.
    @functools.wraps(original)
    def _set_key(self: Any, flat_key: Any, stats: Any) -> Any:
        try:
            if getattr(stats, _NAME, None) is None:
                setattr(stats, _NAME, block_name(flat_key))
        except Exception as exc:
            _fail("timer name", exc)
        return original(self, flat_key, stats)
    return _set_key


def _patched_log_time(original: Callable[..., Any]) -> Callable[..., Any]:
    # `log_time(key, *, ...)`: keyword arguments only after the key (no *args to pack).
    @functools.wraps(original)
    def log_time(self: Any, key: Any, **kwargs: Any) -> Any:
        stats = original(self, key, **kwargs)
        try:
            if getattr(stats, _NAME, None) is None:
                setattr(stats, _NAME, block_name(key))
        except Exception as exc:
            _fail("timer name", exc)
        return stats
    return log_time


# Per block, the glue below runs on RLlib's hottest path (thousands of connector timers per
# iteration in each env runner): no helper calls on the common path, one tuple per block.

def _patched_enter(original: Callable[..., Any]) -> Callable[..., Any]:
    from otel_rl.timers import hierarchical_timer

    local = _open

    @functools.wraps(original)
    def __enter__(self: Any) -> Any:
        name = self._otel_rl_block  # the class's None unless named
        if name is not None:
            try:
                timer = hierarchical_timer(name)
                timer.__enter__()
                try:
                    local.blocks.append((self, timer))
                except AttributeError:
                    local.blocks = [(self, timer)]
            except Exception as exc:
                _fail("timer start", exc)
        return original(self)
    return __enter__


#: Marks a block whose stats object was exited while a block opened inside it was still open.
_ENDED = object()


def _end(owner: object, blocks: list[tuple[object, Any]],
         exc_info: tuple[Any, Any, Any]) -> None:
    """`owner`'s block ends (the uncommon cases: `owner` is not the innermost open block, or
    blocks whose stats objects ended early wait under it)."""
    if blocks[-1][0] is not owner:
        # Exited by hand before a block opened inside it (connector pipelines enter and exit
        # stats objects themselves): it ends when that inner block ends, so blocks still nest.
        for i in range(len(blocks) - 1, -1, -1):
            if blocks[i][0] is owner:
                blocks[i] = (_ENDED, blocks[i][1])
                return
        return
    blocks.pop()[1].__exit__(*exc_info)
    while blocks and blocks[-1][0] is _ENDED:
        blocks.pop()[1].__exit__(*exc_info)


def _patched_exit(original: Callable[..., Any]) -> Callable[..., Any]:
    local = _open

    @functools.wraps(original)
    def __exit__(self: Any, exc_type: Any, exc_value: Any, tb: Any) -> Any:
        try:
            return original(self, exc_type, exc_value, tb)
        finally:
            try:
                blocks = local.blocks
                if blocks:
                    last = blocks[-1]
                    if last[0] is self and (len(blocks) == 1 or blocks[-2][0] is not _ENDED):
                        blocks.pop()
                        last[1].__exit__(exc_type, exc_value, tb)
                    else:
                        _end(self, blocks, (exc_type, exc_value, tb))
            except AttributeError:
                pass  # nothing timed on this thread yet
            except Exception as exc:
                _fail("timer end", exc)
    return __exit__


def _name_process(role: str, index: Any) -> None:
    """Give this Ray worker process of the run the role of the RLlib component it runs."""
    # Looked up, not imported: loaded in every Ray worker that joined the run (`ray_support`),
    # and the import graph stays one-way (ray_support imports propagation, which imports us).
    worker = sys.modules.get("otel_rl._internal.ray_support.worker")
    if worker is not None:
        worker.set_role(role, int(index or 0))


def _patched_init(original: Callable[..., Any], role: str,
                  index_of: Callable[[Any], Any]) -> Callable[..., Any]:
    """`original` names its process `role` with `index_of(self)` (None: it does not)."""
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            index = index_of(self)
            if index is not None:
                _name_process(role, index)
        except Exception as exc:
            _fail(f"{role} role", exc)
    return __init__


#: Per patched stats class: (RLlib's own ``__enter__``, ``__exit__``, the pure glue's), for
#: `_use_accelerator` to install the compiled or the pure glue.
_stats_classes: dict[type, tuple[Any, Any, Any, Any]] = {}


def _patch_stats(module: ModuleType) -> None:
    cls = module.StatsBase
    # Read and set as an attribute, never through ``__dict__``: on Python 3.11+ touching an
    # instance's ``__dict__`` turns its attribute values into a real dict, and RLlib's own
    # attribute reads on that stats object get slower (+0.3 µs a block, measured).
    setattr(cls, _NAME, None)
    enter, exit_ = cls.__enter__, cls.__exit__
    _stats_classes[cls] = (enter, exit_, _patched_enter(enter), _patched_exit(exit_))
    _use_accelerator_for(cls, _follow_accelerator())


def _follow_accelerator() -> bool:
    """Have `_use_accelerator` follow the ``accelerator`` setting; whether it is on now."""
    from otel_rl._internal import recorder

    if _use_accelerator not in recorder.accelerator_hooks:
        recorder.accelerator_hooks.append(_use_accelerator)
    return recorder.accelerator_on()


def compiled_glue(cls: type, timer: Any) -> tuple[Any, Any] | None:
    """The compiled glue's ``(__enter__, __exit__)`` for the patched stats class `cls`, opening
    blocks of `timer` (``hierarchical_timer``; benchmarks give a no-op timer to measure the
    glue alone); None where it is not built or does not fit this build."""
    from otel_rl._internal import accel

    module = accel.compiled()
    if module is None or not hasattr(module, "install_rllib"):
        return None
    enter, exit_, _, pure_exit = _stats_classes[cls]
    enter, exit_ = _compiled_own.get(cls, (enter, exit_))
    try:
        return module.install_rllib(cls, enter, exit_, pure_exit, timer,  # type: ignore[no-any-return]
                                    _open, _ENDED, _end, _fail)
    except Exception as exc:  # a build that does not fit: stay pure
        _fail("compiled glue", exc)
        return None


#: sha256 (first 16 hex digits) of the dedented source of each RLlib function
#: `_hotpath.rllib_stats` does statement for statement (RLlib 2.60). Any other text, and
#: RLlib's Python functions stay the ones the glue calls.
OWN_SOURCES = {
    "StatsBase.__enter__": "dd737ee7e39a70b3",
    "StatsBase.__exit__": "4d67bcc777596dbc",
    "EmaStats.push": "edbdd166cab2a2bd",
    "safe_isnan": "65b202cd4f73be1d",
}

#: Per patched stats class: the compiled copy of RLlib's own ``__enter__`` and ``__exit__``
#: (`_patch_ema`), which the compiled glue calls in place of RLlib's Python ones.
_compiled_own: dict[type, tuple[Any, Any]] = {}


def _source_digest(function: Any) -> str:
    # Imported here: every process of a run imports this module at start-up, and these three
    # cost ~8 ms there (issue 19); only a process that meets RLlib reads sources.
    import hashlib
    import inspect
    import textwrap

    text = textwrap.dedent(inspect.getsource(function))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _reads_as(functions: dict[str, Any], sources: dict[str, str]) -> bool:
    """Whether each of `functions` has the source digest `sources` gives its name (False where
    there is no source to read: a zip, only .pyc)."""
    try:
        return all(_source_digest(f) == sources[k] for k, f in functions.items())
    except (OSError, TypeError):
        return False


def compiled_own(ema: ModuleType) -> tuple[Any, Any] | None:
    """The compiled copy of RLlib's ``StatsBase.__enter__`` / ``__exit__`` (an ``EmaStats``'
    push inlined) for the stats module `ema` (``ray.rllib.utils.metrics.stats.ema``), or None
    where it is not built, TensorFlow is loaded there, or any of the four functions it copies
    reads otherwise than `OWN_SOURCES` says."""
    from otel_rl._internal import accel

    module = accel.compiled()
    cls = ema.StatsBase
    if module is None or not hasattr(module, "rllib_stats") or cls not in _stats_classes:
        return None
    enter, exit_, _, _ = _stats_classes[cls]
    push = ema.EmaStats.__dict__.get("push")
    functions = {"StatsBase.__enter__": enter, "StatsBase.__exit__": exit_,
                 "EmaStats.push": push, "safe_isnan": ema.safe_isnan}
    if ema.tf or not _reads_as(functions, OWN_SOURCES):
        return None
    return module.rllib_stats(sys.modules[cls.__module__].__dict__,  # type: ignore[no-any-return]
                              vars(ema), push, enter, exit_, ema.tf, ema.safe_isnan)


def _patch_ema(module: ModuleType) -> None:
    own = compiled_own(module)
    if own is not None:
        from otel_rl._internal import recorder

        _compiled_own[module.StatsBase] = own
        _use_accelerator_for(module.StatsBase, recorder.accelerator_on())


def own_methods(cls: type) -> tuple[Any, Any, Any, Any]:
    """RLlib's own ``__enter__`` and ``__exit__`` of the patched stats class `cls`, then the
    pure glue's (for benchmarks that switch between them)."""
    return _stats_classes[cls]


def _use_accelerator_for(cls: type, on: bool) -> bool:
    """Install the compiled glue (`_hotpath.install_rllib`, the same results without the two
    Python frames per block) on `cls` when `on` and it is built, else the pure glue above;
    whether the compiled one is in use."""
    from otel_rl.timers import hierarchical_timer

    _, _, pure_enter, pure_exit = _stats_classes[cls]
    compiled = compiled_glue(cls, hierarchical_timer) if on else None
    cls.__enter__, cls.__exit__ = compiled or (pure_enter, pure_exit)  # type: ignore[attr-defined]
    return compiled is not None


def _use_accelerator(on: bool) -> None:
    """`recorder.use_accelerator`'s hook: every patched stats class and MetricsLogger follows
    the setting."""
    for cls in _stats_classes:
        _use_accelerator_for(cls, on)
    for cls, (own, compiled) in _loggers.items():
        cls.log_time = compiled if on and compiled is not None else own  # type: ignore[attr-defined]


def accelerated() -> bool:
    """Whether RLlib's timer blocks run the compiled glue (False before RLlib is imported)."""
    return any(cls.__dict__.get("__enter__") is not pure[2]
               for cls, pure in _stats_classes.items())


#: sha256 (first 16 hex digits) of the dedented source of each function
#: `_hotpath.rllib_log_time` stands in for where the key is held (RLlib 2.60's
#: metrics_logger.py, and the `force_tuple` and `tree.flatten` it calls). Any other text, and
#: ``MetricsLogger.log_time`` stays RLlib's.
LOG_TIME_SOURCES = {
    "MetricsLogger.log_time": "9fbfb8cc0f1befa0",
    "MetricsLogger._maybe_create_stats_object": "3a424be50e4adcc5",
    "MetricsLogger._key_in_stats": "8dcc8e218d94c559",
    "MetricsLogger._get_key": "6cc23e4481a9669c",
    "_DummyRLock.__enter__": "b4ff44ab5a2dd3ec",
    "_DummyRLock.__exit__": "3771a2bd0f1133f0",
    "force_list": "40dc8e2932fdd517",
    "tree.flatten": "ab7f782c769a19cc",
}

#: Per patched MetricsLogger class: RLlib's own ``log_time``, then its compiled copy (None
#: where there is none), installed while the accelerator is on.
_loggers: dict[type, tuple[Any, Any]] = {}


def compiled_log_time(module: ModuleType, own: Any) -> Any | None:
    """The compiled copy of RLlib's ``MetricsLogger.log_time`` `own` (a method descriptor of
    metrics_logger.py `module`'s ``MetricsLogger``; RLlib's `own` for any key not held yet), or
    None where it is not built or what it stands in for reads otherwise than `LOG_TIME_SOURCES`
    says."""
    from otel_rl._internal import accel

    compiled = accel.compiled()
    if compiled is None or not hasattr(compiled, "rllib_log_time"):
        return None
    cls, lock, tree, force_tuple = (getattr(module, name, None) for name in (
        "MetricsLogger", "_DummyRLock", "tree", "force_tuple"))
    flatten = getattr(tree, "flatten", None)
    if not (isinstance(cls, type) and isinstance(lock, type) and callable(flatten)
            and isinstance(force_tuple, functools.partial) and force_tuple.args == ()
            and force_tuple.keywords == {"to_tuple": True}):
        return None
    maybe, key_in, get_key = (getattr(cls, name, None) for name in (
        "_maybe_create_stats_object", "_key_in_stats", "_get_key"))
    lock_enter, lock_exit = lock.__dict__.get("__enter__"), lock.__dict__.get("__exit__")
    functions = {"MetricsLogger.log_time": own,
                 "MetricsLogger._maybe_create_stats_object": maybe,
                 "MetricsLogger._key_in_stats": key_in, "MetricsLogger._get_key": get_key,
                 "_DummyRLock.__enter__": lock_enter, "_DummyRLock.__exit__": lock_exit,
                 "force_list": force_tuple.func, "tree.flatten": flatten}
    if not _reads_as(functions, LOG_TIME_SOURCES):
        return None
    try:
        return compiled.rllib_log_time(cls, own, vars(module), tree, flatten, force_tuple,
                                       maybe, key_in, get_key, lock, lock_enter, lock_exit)
    except Exception as exc:  # a build that does not fit: stay RLlib's
        _fail("compiled log_time", exc)
        return None


def _patch_logger(module: ModuleType) -> None:
    cls = module.MetricsLogger
    if callable(getattr(cls, "_set_key", None)):  # RLlib 2.60: name stats objects once
        cls._set_key = _patched_set_key(cls._set_key)
        own = cls.log_time
        compiled = compiled_log_time(module, own)
        _loggers[cls] = (own, compiled)
        if compiled is not None and _follow_accelerator():
            cls.log_time = compiled
    else:  # per `log_time` call (~0.3 µs a block)
        cls.log_time = _patched_log_time(cls.log_time)


def _patch_env_runner(module: ModuleType) -> None:
    cls = module.EnvRunner
    # Only a remote env runner (RLlib numbers them from 1) names its process: index 0 is the
    # local one, built where the Algorithm runs (the driver, or a Tune trial's actor).
    cls.__init__ = _patched_init(cls.__init__, "EnvRunner", lambda r: r.worker_index or None)


#: The block a Learner's update runs in when the Learner is the driver's own
#: (``num_learners=0``, RLlib's default): named after the role a Learner actor has.
LOCAL_LEARNER_BLOCK = "Learner"


def _patched_update(original: Callable[..., Any]) -> Callable[..., Any]:
    """A local Learner's (``num_learners=0``) update runs in a ``Learner`` block: in the driver's
    tree, learning stays apart from sampling as it is with Learner actors."""
    from otel_rl.timers import hierarchical_timer

    @functools.wraps(original)
    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._otel_rl_local:  # an attribute, not through __dict__ (see _patch_stats)
            return original(self, *args, **kwargs)
        try:
            block = hierarchical_timer(LOCAL_LEARNER_BLOCK)
            block.__enter__()
        except Exception as exc:
            _fail("Learner block", exc)
            return original(self, *args, **kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                block.__exit__(None, None, None)
            except Exception as exc:
                _fail("Learner block", exc)
    return update


def _patch_learner(module: ModuleType) -> None:
    # A Learner is local (built where the Algorithm runs: the driver, or a Tune trial's
    # actor) until its LearnerGroup makes it one of its remote Learners: RLlib then gives it
    # its index (`_set_learner_index_and_placement_group`, before any update), and only then
    # is its process a ``Learner``.
    cls = module.Learner
    cls._otel_rl_local = True
    cls.update = _patched_update(cls.update)
    original = cls._set_learner_index_and_placement_group

    @functools.wraps(original)
    def set_index(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            self._otel_rl_local = False
            _name_process("Learner", self._learner_index)
        except Exception as exc:
            _fail("Learner role", exc)
        return result

    cls._set_learner_index_and_placement_group = set_index


def _guarded(name: str, patch: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def apply(module: ModuleType) -> None:
        try:
            patch(module)
        except Exception as exc:  # another RLlib version: its timers stay RLlib's only
            log.warning("otel_rl: cannot instrument %s (%r); RLlib runs without it", name, exc)
    return apply


#: RLlib module -> its patch, applied right after the module is first executed (by
#: `propagation`'s patch-on-import finder, at once for a module already imported; the
#: finder knows the names as `propagation.RLLIB_MODULES`, so a worker imports this module
#: only with RLlib).
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    name: _guarded(name, patch) for name, patch in (
        ("ray.rllib.utils.metrics.stats.base", _patch_stats),
        ("ray.rllib.utils.metrics.stats.ema", _patch_ema),
        ("ray.rllib.utils.metrics.metrics_logger", _patch_logger),
        ("ray.rllib.env.env_runner", _patch_env_runner),
        ("ray.rllib.core.learner.learner", _patch_learner),
    )
}
