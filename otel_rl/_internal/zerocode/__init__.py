"""Zero-code mode: `otel-rl run` puts this folder first on PYTHONPATH, so its `sitecustomize`
runs at the start of the program and of every Python process the program starts. It serves
otel_rl's timers under the ML-Agents and Sample Factory module names (`aliases`) and configures
otel_rl from the environment.
"""

from __future__ import annotations

import os

#: The folder `otel-rl run` prepends to PYTHONPATH (it holds `sitecustomize.py`).
# Only sitecustomize.py lives in the folder put on PYTHONPATH: nothing else of ours can shadow
# a module of the program's.
ZEROCODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")

#: Set to "1" by `otel-rl run` for the program it starts. The first Python process to see "1"
#: is the program's main process: it configures otel_rl as the run and rewrites the value to
#: ``pid:<its pid>`` (still its own after an exec). Python processes it starts see another pid
#: and configure only when they were handed a trace context (a subprocess otel_rl instrumented);
#: multiprocessing workers are started by otel_rl's own worker bootstrap, and helpers such as
#: multiprocessing's resource tracker stay quiet instead of posing as a second run.
MAIN_ENV = "OTEL_RL_ZEROCODE_MAIN"
