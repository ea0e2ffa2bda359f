"""The optional compiled hot path (everything else is in pyproject.toml).

`otel_rl/_internal/_hotpath.c` (and `_metricsacc.c`, the metrics' column reader, `_relaycols.c`, the relay's
column writer, and `_timingacc.c`, Sample Factory's Timing) is built when
a C compiler and Python's headers are there; ``optional=True`` makes a failed build a warning,
and otel_rl then runs its pure-Python hot path (`otel_rl._internal.accel`) and column reader. Python's own ``scripts/build_accel.py`` builds it in place
for a checkout (tests run from one).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(f"otel_rl._internal.{name}", [f"otel_rl/_internal/{name}.c"],
                             depends=["otel_rl/_internal/_accel.h"],
                             optional=True) for name in ("_hotpath", "_metricsacc", "_relaycols", "_timingacc")])
