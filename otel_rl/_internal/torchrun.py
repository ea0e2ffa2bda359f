"""torchrun (``torch.distributed.run``): its ranks as workers, its nodes as parts of one run.

Under ``otel-rl run -- torchrun ...`` the torchrun agent is the program's main process and
starts each rank with ``subprocess.Popen`` (an environment holding ``RANK``, ``LOCAL_RANK`` and
``TORCHELASTIC_RUN_ID``), which otel_rl's subprocess patch hands the agent's context: a rank
joins the run as a worker with role ``rank`` and index ``RANK`` (`child_role`).

Several nodes (``torchrun --nnodes 2 --rdzv-id JOB ...``, one ``otel-rl run`` per node) share
nothing but torchrun's own arguments. `launch_environment` derives the run id from the
rendezvous id (``torchrun-JOB``), so every node lands in the same run traces (trace ids are
derived from the run id, see docs/DESIGN.md "Long runs"). Node 0 (``--node-rank``, default 0)
is the run's main process; any other node's agent joins the run as a worker with role ``node``
and index its node rank, with no relay (it exports on its own, on its own clock), under the
run span, whose id is derived from the run id too. `otel-rl tree --run-id` then finds every
node's aggregate in the run trace.

Without ``--node-rank`` (c10d rendezvous), torchrun gives each node its rank only at the
rendezvous, after ``otel-rl run`` started the agent: then `launch_environment` marks the
agent's environment (`AUTO_NODE`) and every node's agent starts as the run's main process.
The first rank the agent starts tells it its node's rank (``GROUP_RANK`` in the rank's
environment, `on_rank_started`): node 0 stays the run's main process; any other node's agent
becomes a ``node`` worker of the run with that index (`_become_node`: as if it had been started
as one; nothing about the run had been exported by then but the agent's own start-up), and
``otel-rl run`` writes no report for it.

No torch import: the command line and environment are read as torchrun reads them
(``--opt value``, ``--opt=value``, ``PET_<OPT>`` variables).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["AUTO_NODE", "child_role", "is_torchrun", "launch_environment", "on_rank_started",
           "options", "training_program"]

#: Set in a multi-node torchrun agent's environment when its node rank is left to the
#: rendezvous (no ``--node-rank``): the agent learns it from the first rank it starts.
AUTO_NODE = "OTEL_RL_TORCHRUN_AUTO_NODE"

#: What a rank's environment holds (set by torch.distributed.elastic for each worker).
_RANK_VARS = ("RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")

#: torchrun's options that take no value; every other option takes one.
_FLAGS = frozenset({"--standalone", "-m", "--module", "--no-python", "--no_python",
                    "--run-path", "--run_path"})

#: The options read here, under the name torchrun stores them as (``PET_<NAME>``).
_WANTED = {"--rdzv-id": "rdzv_id", "--rdzv_id": "rdzv_id", "--node-rank": "node_rank",
           "--node_rank": "node_rank", "--nnodes": "nnodes", "--standalone": "standalone"}

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def child_role(child_env: Mapping[str, str],
               environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """``("rank", RANK)`` when a process starts a torchrun rank with `child_env`: the child's
    environment holds a rank's variables and this process is not a rank itself (a rank's own
    subprocesses inherit the variables and stay plain subprocesses)."""
    environ = os.environ if environ is None else environ
    if any(var not in child_env for var in _RANK_VARS) or "LOCAL_RANK" in environ:
        return None
    try:
        return "rank", int(child_env["RANK"])
    except ValueError:
        return None


def is_torchrun(argv: Sequence[str]) -> bool:
    """Whether `argv` starts torchrun: ``torchrun ...`` or ``python -m torch.distributed.run``."""
    if not argv:
        return False
    name = os.path.basename(argv[0])
    if name == "torchrun":
        return True
    if name.startswith("python"):
        for i, arg in enumerate(argv[1:-1], 1):
            if arg == "-m":
                return argv[i + 1] in ("torch.distributed.run", "torch.distributed.launch")
            if not arg.startswith("-"):
                return False
    return False


def _torchrun_args(argv: Sequence[str]) -> list[str]:
    """The arguments torchrun itself parses (before the training script)."""
    if os.path.basename(argv[0]) == "torchrun":
        return list(argv[1:])
    return list(argv[list(argv).index("-m") + 2:])


def _scan(argv: Sequence[str]) -> tuple[dict[str, str], list[str], bool]:
    """The wanted options on torchrun's command line, the training program's argv (script or
    module first), and whether it is a module (``-m``)."""
    found: dict[str, str] = {}
    module = False
    args = _torchrun_args(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            break  # the training script: the rest is its own
        i += 1
        option, has_value, value = arg.partition("=")
        if option in _FLAGS:
            found.update({"standalone": "1"} if option == "--standalone" else {})
            module = module or option in ("-m", "--module")
            continue
        if not has_value:
            value = args[i] if i < len(args) else ""
            i += 1
        name = _WANTED.get(option)
        if name is not None:
            found[name] = value
    return found, args[i:], module


def options(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's ``rdzv_id``, ``node_rank``, ``nnodes`` and ``standalone`` as it would read
    them: the command line (up to the training script) over ``PET_*`` variables."""
    found = {name: environ[f"PET_{name.upper()}"] for name in set(_WANTED.values())
             if environ.get(f"PET_{name.upper()}")}
    found.update(_scan(argv)[0])
    return found


def training_program(argv: Sequence[str]) -> list[str]:
    """The program torchrun runs on each rank, as a command line (``python -m mod`` for a
    module), to name the service after it; [] when there is none."""
    _, program, module = _scan(argv)
    if program and module:
        return ["python", "-m", *program]
    return program


def _multi_node(nnodes: str) -> bool:
    try:
        return max(int(n) for n in nnodes.split(":")) > 1
    except ValueError:
        return False


def launch_environment(argv: Sequence[str], env: MutableMapping[str, str]) -> int | None:
    """Prepare `env` for ``otel-rl run -- torchrun ...`` on several nodes: the run id from the
    rendezvous id (unless ``OTEL_RL_RUN_ID`` is set) and, on a node other than 0, a carrier
    making its agent a ``node`` worker of that run. Returns the node rank when it is not the
    run's main node (None otherwise, and for anything but a multi-node torchrun)."""
    if not is_torchrun(argv):
        return None
    opts = options(argv, env)
    rdzv_id = opts.get("rdzv_id", "none")
    if (opts.get("standalone", "0") not in ("", "0") or rdzv_id in ("", "none")
            or not _multi_node(opts.get("nnodes", "1"))):
        return None
    if not env.get("OTEL_RL_RUN_ID", "").strip():
        env["OTEL_RL_RUN_ID"] = "torchrun-" + (_UNSAFE.sub("_", rdzv_id)[:100] or "job")
    if "node_rank" not in opts:  # left to the rendezvous: the agent finds out (see above)
        env[AUTO_NODE] = "1"
        return None
    try:
        node_rank = int(opts.get("node_rank", "0"))
    except ValueError:
        node_rank = 0
    if node_rank <= 0:
        return None
    from otel_rl._internal import aggregates, carrier

    run_id = env["OTEL_RL_RUN_ID"].strip()
    trace_id, span_id = aggregates.run_trace_id(run_id), aggregates.run_span_id(run_id)
    run = [f"{trace_id:032x}", f"{span_id:016x}"]
    data = {"path": [], "run_id": run_id, "role": "node", "index": node_rank, "run": run}
    carrier.to_env(carrier.make(trace_id, span_id, True, data), env)
    return node_rank


_decided = False


def on_rank_started(rt: Any, child_env: Mapping[str, str],
                    environ: Mapping[str, str] | None = None) -> None:
    """torchrun's agent, whose runtime is `rt`, starts a rank with `child_env`: where the node
    rank was left to the rendezvous (`AUTO_NODE`), the first rank says which node this is
    (``GROUP_RANK``); on any node but 0 the agent stops being the run's main process and joins
    as ``node``."""
    global _decided
    environ = os.environ if environ is None else environ
    if _decided or environ.get(AUTO_NODE) != "1":
        return
    _decided = True
    try:
        group_rank = int(child_env.get("GROUP_RANK", "0"))
    except ValueError:
        return
    if group_rank > 0 and rt is not None and not rt.is_worker:
        _become_node(rt, group_rank)


def _become_node(rt: Any, index: int) -> None:
    """Make the main process `rt` a ``node`` worker of its run, as `launch_environment`'s
    carrier would have made it: the run span and the whole-run tree are node 0's."""
    from otel_rl._internal import carrier, semconv

    trace_id, span_id = rt.root_run
    data = {"path": [], "run_id": rt.run_id, "role": "node", "index": index,
            "run": [f"{trace_id:032x}", f"{span_id:016x}"]}
    rt.ctx = carrier.parse(carrier.make(trace_id, span_id, True, data))
    rt.is_worker = True
    rt.role, rt.index = "node", index
    rt.resource[semconv.WORKER_ROLE] = "node"
    rt.resource[semconv.WORKER_INDEX] = index
    if rt.windower is not None:  # a worker's windows: no re-parenting of other processes
        rt.windower = rt.make_windower()


def joined_as_node(folder: str | None) -> bool:
    """After the agent ended (``otel-rl run``, `AUTO_NODE`): whether it had joined as a node
    (it wrote its own timers.<pid>.json, not the run's timers.json)."""
    if folder is None or not os.path.isdir(folder):
        return False
    names = os.listdir(folder)
    return "timers.json" not in names and any(
        n.startswith("timers.") and n.endswith(".json") for n in names)
