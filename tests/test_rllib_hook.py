"""The RLlib hook without RLlib: block names from RLlib's timer keys, and no cost in a program
that never imports RLlib. The real RLlib runs are in tests/frameworks/test_rllib.py."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from otel_rl._internal.rllib import block_name

REPO = Path(__file__).resolve().parents[1]


def test_block_names_are_rllib_keys_without_timers() -> None:
    assert block_name(("timers", "training_iteration")) == "training_iteration"
    assert block_name("sample") == "sample"
    assert block_name(("env_to_module_connector", "timers", "connectors", "numpy_to_tensor")) \
        == "env_to_module_connector.connectors.numpy_to_tensor"
    assert block_name((("learners", ("p", 0)), "timers", "update")) == "learners.p.0.update"
    assert block_name(("timers",)) == "timers"


def test_the_rllib_hook_imports_nothing_of_ray_until_the_program_does(tmp_path: Path) -> None:
    code = ("import sys, json, otel_rl\n"
            "otel_rl.configure(output_dir=sys.argv[1])\n"
            "from otel_rl.timers import hierarchical_timer\n"
            "with hierarchical_timer('work'):\n"
            "    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'ray' or m.startswith(("
            "'ray.', 'torch')))))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert done.stderr == ""


def test_an_rllib_module_of_another_shape_is_left_alone_with_one_warning(caplog: Any) -> None:
    from otel_rl._internal import rllib

    module = types.ModuleType("ray.rllib.utils.metrics.stats.base")  # no StatsBase in it
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        rllib.PATCHES["ray.rllib.utils.metrics.stats.base"](module)
    assert [r.getMessage() for r in caplog.records] == [
        "otel_rl: cannot instrument ray.rllib.utils.metrics.stats.base (AttributeError(\"module "
        "'ray.rllib.utils.metrics.stats.base' has no attribute 'StatsBase'\")); RLlib runs "
        "without it"]
    assert vars(module).keys() == {"__name__", "__doc__", "__package__", "__loader__",
                                   "__spec__"}


def _logger_module(with_set_key: bool) -> types.ModuleType:
    """A stand-in for RLlib's metrics_logger module: a logger storing stats objects by key."""

    class Stats:
        pass

    class MetricsLogger:
        def __init__(self) -> None:
            self.stats: dict[Any, Stats] = {}

        def log_time(self, key: Any, **kwargs: Any) -> Stats:
            if key not in self.stats:
                if with_set_key:
                    self._set_key(key, Stats())
                else:
                    self.stats[key] = Stats()
            return self.stats[key]

        if with_set_key:
            def _set_key(self, flat_key: Any, stats: Stats) -> None:
                self.stats[flat_key] = stats

    module = types.ModuleType("ray.rllib.utils.metrics.metrics_logger")
    module.MetricsLogger = MetricsLogger  # type: ignore[attr-defined]
    return module


def test_a_stats_object_is_named_once_when_the_logger_stores_it() -> None:
    from otel_rl._internal import rllib

    module = _logger_module(with_set_key=True)
    log_time = module.MetricsLogger.log_time
    rllib.PATCHES["ray.rllib.utils.metrics.metrics_logger"](module)
    assert module.MetricsLogger.log_time is log_time  # no wrapper per timed block
    # ... and no compiled copy: the stand-in is not RLlib 2.60's metrics_logger.py
    assert rllib._loggers.pop(module.MetricsLogger) == (log_time, None)
    logger = module.MetricsLogger()
    stats = logger.log_time(("env_to_module_connector", "timers", "connectors", "add_states"))
    assert stats.__dict__[rllib._NAME] == "env_to_module_connector.connectors.add_states"
    logger._set_key(("learners", "timers", "update"), stats)  # stored again: keeps its name
    assert stats.__dict__[rllib._NAME] == "env_to_module_connector.connectors.add_states"


def test_without_set_key_log_time_names_the_stats_object() -> None:
    from otel_rl._internal import rllib

    module = _logger_module(with_set_key=False)
    log_time = module.MetricsLogger.log_time
    rllib.PATCHES["ray.rllib.utils.metrics.metrics_logger"](module)
    assert module.MetricsLogger.log_time is not log_time
    stats = module.MetricsLogger().log_time(("timers", "training_iteration"))
    assert stats.__dict__[rllib._NAME] == "training_iteration"
