"""Ray programs for tests/frameworks/test_ray.py, run with the Ray venv's Python.

``python ray_workloads.py SCENARIO OUT [ADDRESS]``; each prints one JSON line of facts
(``RESULT {...}``) the test checks against the run's timers.json and spans. Timed blocks use
ML-Agents' API served by otel_rl (``otel_rl.timers``); nothing in a remote function or actor
knows about otel_rl.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import ray

from otel_rl.timers import hierarchical_timer as timer

RAY_INIT: dict[str, Any] = {"include_dashboard": False, "log_to_driver": os.environ.get("LOG_TO_DRIVER") == "1"}


def result(**facts: Any) -> None:
    print("RESULT " + json.dumps(facts), flush=True)


@ray.remote
def rollout(n: int) -> int:
    for _ in range(n):
        with timer("rollout_step"):
            pass
    return os.getpid()


@ray.remote
def fan_out(n: int) -> list[int]:
    with timer("fan_out"):
        return ray.get([rollout.remote(n) for _ in range(2)])  # nested: a task's tasks


@ray.remote
class Sim:
    def __init__(self) -> None:
        with timer("sim_init"):
            pass

    def step(self, n: int) -> int:
        for _ in range(n):
            with timer("env_step"):
                pass
        return os.getpid()

    def stream(self, n: int) -> Any:  # a generator method
        for i in range(n):
            with timer("sim_stream_step"):
                pass
            yield i


@ray.remote
def stream(n: int) -> Any:
    """A streaming generator task: its body runs as the caller iterates, after the call."""
    for i in range(n):
        with timer("stream_step"):
            pass
        yield i


@ray.remote
class AsyncSim:
    async def stream(self, n: int) -> Any:  # an async generator method
        for i in range(n):
            with timer("astream_step"):
                await asyncio.sleep(0)
            yield i

    async def labelled(self, n: int, label: int) -> Any:
        """An async generator method called several times at once (each from its own block)."""
        for i in range(n):
            await asyncio.sleep(0.01)
            with timer(f"labelled_{label}"):
                await asyncio.sleep(0.005)
            yield i

    async def work(self, label: str) -> str:
        with timer(f"async_{label}"):
            pass
        await asyncio.sleep(0.2)  # the other call runs meanwhile, on the same event loop
        with timer("async_after"):
            pass
        return label

    async def late(self, i: int) -> int:
        """Awaits before its first block: calls from one block interleave with none of them
        inside a block yet when the next one starts."""
        await asyncio.sleep(0.01 * (i % 3))
        with timer("late_step"):
            await asyncio.sleep(0.05)
            with timer("late_inner"):
                await asyncio.sleep(0)
        return i

    async def warned(self) -> bool:
        """Whether Ray warned of a blocking ``ray.get`` in this async actor's process (this
        program makes none: otel_rl's deliveries must not either)."""
        await asyncio.sleep(1.0)  # two delivery intervals: this process has pushed by now
        return bool(ray._private.worker.blocking_get_inside_async_warned)


@ray.remote(max_concurrency=2)
class Threaded:
    def work(self) -> int:
        with timer("threaded_work"):
            time.sleep(0.2)  # both calls in flight at once, on two threads
        return threading.get_ident()


@ray.remote
def plain(x: int, *, y: int = 1) -> int:
    return x + y  # runs where otel_rl cannot be imported


@ray.remote
def task_name() -> str | None:
    return ray.get_runtime_context().get_task_name()


def users_own_hook() -> None:
    os.environ["USERS_OWN_HOOK"] = "ran"


@ray.remote
def hook_ran() -> str | None:
    return os.environ.get("USERS_OWN_HOOK")


#: Ray's setting otel_rl gives the raylet a run's local ``ray.init`` starts (no idle
#: workers prestarted without the job's runtime_env).
PRESTART = "RAY_prestart_worker_first_driver"


def raylet_env(name: str) -> str | None:
    """The variable `name` in the environment of this session's raylet."""
    from ray._private import ray_constants

    node = ray._private.worker._global_node
    process = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
    with open(f"/proc/{process.pid}/environ", "rb") as f:
        pairs = [entry.split(b"=", 1) for entry in f.read().split(b"\0") if b"=" in entry]
    return {k.decode(): v.decode() for k, v in pairs}.get(name)


def calls(out: str, address: str | None) -> None:
    """Every kind of call, each from its own block; the issue's scenario (2 actors x 3 calls x
    20 blocks, a task called 3 times) included. The program has a setup hook of its own."""
    env = {"worker_process_setup_hook": users_own_hook}
    if address and address.startswith("ray://"):
        # Ray Client (the server runs ray.init with the job's settings; it runs no setup
        # hook of the program's): a runtime_env of the program's own, merged with the run's.
        ray.init(address, runtime_env={"env_vars": {"USERS_OWN_HOOK": "ran"}},
                 log_to_driver=RAY_INIT["log_to_driver"])
        if os.environ.get("OTEL_RL_CONFIGURE"):  # no `otel-rl run`: configured in code
            import otel_rl

            otel_rl.configure(spans="all", output_dir=os.environ["OTEL_RL_CONFIGURE"])
    elif address:
        ray.init(address=address, runtime_env=env, **RAY_INIT)
    else:
        ray.init(num_cpus=2, runtime_env=env, **RAY_INIT)
    facts: dict[str, Any] = {}
    if not address:  # the raylet this ray.init started, and what ray.init left behind
        facts["raylet_prestart"] = raylet_env(PRESTART)
        facts["prestart_left"] = os.environ.get(PRESTART)
    with timer("iteration"):
        with timer("make"):
            sims = [Sim.remote() for _ in range(2)]
            async_sim = AsyncSim.remote()
            threaded = Threaded.remote()
        for _ in range(3):
            with timer("sample"):
                ray.get([s.step.remote(20) for s in sims])
            with timer("train"):
                train_pids = ray.get([rollout.remote(3) for _ in range(2)])
        with timer("evaluate"):  # the same task, another caller: same worker processes
            eval_pids = ray.get([rollout.remote(5) for _ in range(2)])
        with timer("nested"):
            ray.get(fan_out.remote(4))
        with timer("async"):
            with timer("from_x"):
                ref_x = async_sim.work.remote("x")
            with timer("from_y"):
                ref_y = async_sim.work.remote("y")
            ray.get([ref_x, ref_y])
        with timer("interleaved"):
            ray.get([async_sim.late.remote(i) for i in range(4)])
        with timer("threads"):
            def call(label: str, into: list[Any]) -> None:
                with timer(label):
                    into.append(ray.get(threaded.work.remote()))
            idents: list[Any] = []
            workers = [threading.Thread(target=call, args=(f"thread_{i}", idents))
                       for i in range(2)]
            for thread in workers:
                thread.start()
            for thread in workers:
                thread.join()
        with timer("submit"):
            ref = sims[0].step.remote(7)
        got: list[Any] = []

        def wait_elsewhere() -> None:
            with timer("wait_elsewhere"):
                ready, _ = ray.wait([ref], timeout=60)
                got.extend(ray.get(ready))
        waiter = threading.Thread(target=wait_elsewhere)
        waiter.start()
        waiter.join()
        if os.environ.get("SHADOW_OTEL_RL"):
            with timer("fail_open"):
                env = {"env_vars": {"PYTHONPATH": os.environ["SHADOW_OTEL_RL"]}}
                facts["plain"] = ray.get(plain.options(runtime_env=env).remote(2, y=3))
                facts["plain_name"] = ray.get(task_name.options(runtime_env=env).remote())
    facts["hook"] = ray.get(hook_ran.remote())
    facts["async_warned"] = ray.get(async_sim.warned.remote())
    with timer("names"):  # the carrier rides in the task's name: the program sees its own
        facts["names"] = ray.get([task_name.remote(), task_name.options(name="mine").remote()])
    facts["reused"] = sorted(set(train_pids) & set(eval_pids))
    facts["threads"] = len(set(idents))
    facts["waited"] = len(got)
    ray.shutdown()
    if os.environ.get("OTEL_RL_CONFIGURE"):
        import otel_rl

        otel_rl.shutdown()
    result(**facts)


@ray.remote
class Doomed:
    def __init__(self, name: str) -> None:
        self.name = name

    def work(self, n: int) -> int:
        for _ in range(n):
            with timer(f"{self.name}_step"):
                pass
        return os.getpid()

    def fail(self) -> None:
        with timer(f"{self.name}_step"):
            raise ValueError("an actor method that raises")

    def leave(self) -> None:
        with timer(f"{self.name}_step"):
            pass
        ray.actor.exit_actor()

    def hang(self, path: str) -> None:
        with timer(f"{self.name}_step"):
            pass
        with open(path, "w") as f:  # the driver kills this process now
            f.write(str(os.getpid()))
        time.sleep(60)


def losses(out: str, address: str | None) -> None:
    """An actor killed with ray.kill, one that raises, one that exits, one whose process is
    SIGKILLed in the middle of a call, then a clean ray.shutdown()."""
    ray.init(num_cpus=2, **RAY_INIT)
    kill_it = os.environ.get("KILL_WORKER") == "1"
    with timer("run_actors"):
        killed, raising, leaving, doomed = (Doomed.remote(n) for n in
                                            ("killed", "raising", "leaving", "doomed"))
        pids = ray.get([a.work.remote(5) for a in (killed, raising, leaving, doomed)])
        if os.environ.get("KILL_IDLE") == "1":
            time.sleep(2.0)  # 4x a worker's delivery interval, doing nothing
            os.kill(pids[3], signal.SIGKILL)
        ray.kill(killed)  # idle: otel_rl has it deliver first
        try:
            ray.get(raising.fail.remote())
        except ray.exceptions.RayTaskError:
            pass
        try:
            ray.get(leaving.leave.remote())
        except ray.exceptions.RayActorError:
            pass
        if kill_it:
            time.sleep(2.0)  # 4x a worker's delivery interval: `work` is delivered by then
            marker = os.path.join(out, "hanging.pid")
            doomed.hang.remote(marker)
            while not os.path.exists(marker) or not open(marker).read():
                time.sleep(0.05)
            os.kill(int(open(marker).read()), signal.SIGKILL)
            time.sleep(1)
    ray.shutdown()
    result(killed_worker=kill_it)


@ray.remote
class Far:
    def step(self, n: int) -> dict[str, Any]:
        for _ in range(n):
            with timer("far_step"):
                pass
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "time": time.time()}


SKEW_SITECUSTOMIZE = """
import time
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + 3600.0
time.time_ns = lambda: _time_ns() + 3600 * 10**9
"""


def multinode(out: str, address: str | None) -> None:
    """Two nodes (``ray.cluster_utils.Cluster``): actors pinned to the second one by a custom
    resource. The second node's processes run on a clock one hour ahead (their Python's
    ``time.time``), as a machine whose clock disagrees with the driver's."""
    from ray.cluster_utils import Cluster

    import otel_rl

    otel_rl.configure()  # settings from the environment (endpoint, output, spans)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    skewed = os.path.join(out, "skewed-clock")
    os.makedirs(skewed, exist_ok=True)
    with open(os.path.join(skewed, "sitecustomize.py"), "w") as f:
        f.write(SKEW_SITECUSTOMIZE)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = skewed  # inherited by the second node's raylet and workers only
    try:
        cluster.add_node(num_cpus=2, resources={"node2": 2})
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    ray.init(address=cluster.address, **RAY_INIT)
    cluster.wait_for_nodes()
    with timer("iteration"):
        with timer("spawn"):
            far = [Far.options(resources={"node2": 1}).remote() for _ in range(2)]
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here_node = ray.get_runtime_context().get_node_id()
            near = Far.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                here_node, soft=False)).remote()
        with timer("remote_sample"):
            seen = ray.get([a.step.remote(10) for a in far])
        with timer("local_sample"):
            here = ray.get(near.step.remote(3))
    driver_node = ray.get_runtime_context().get_node_id()
    ray.shutdown()
    cluster.shutdown()
    result(driver_node=driver_node, far=seen, near=here, driver_time=time.time(),
           run_id=os.environ.get("OTEL_RL_RUN_ID"))


def late(out: str, address: str | None) -> None:
    """``otel_rl.configure()`` after ``ray.init()`` (which has a setup hook of its own): an
    actor made before configure stays outside the run; what is made after joins it."""
    ray.init(num_cpus=2, runtime_env={"worker_process_setup_hook": users_own_hook}, **RAY_INIT)
    early = Sim.remote()
    ray.get(early.step.remote(1))
    import otel_rl

    otel_rl.configure(spans="all", output_dir=out)
    with timer("iteration"):
        with timer("make"):
            sims = [Sim.remote() for _ in range(2)]
        with timer("sample"):
            ray.get([s.step.remote(20) for s in sims])
        with timer("train"):
            ray.get([rollout.remote(3) for _ in range(2)])
        with timer("nested"):
            ray.get(fan_out.remote(4))
        with timer("early"):
            early_pid = ray.get(early.step.remote(5))  # runs, outside the run
    facts = {"hook": ray.get(hook_ran.remote()), "early": early_pid > 0,
             "names": ray.get([task_name.remote()])}
    ray.shutdown()
    otel_rl.shutdown()
    result(**facts)


class _Scoped:
    """An actor the program lets go of right after its one call (Ray ends it within ~0.3 s,
    before a worker's next periodic delivery)."""

    def work(self, label: str, n: int) -> int:
        for _ in range(n):
            with timer(f"{label}_step"):
                pass
        return os.getpid()


Scoped = ray.remote(_Scoped)


@ray.remote
class ScopedAsync:
    async def work(self, label: str, n: int) -> int:
        for _ in range(n):
            with timer(f"{label}_step"):
                await asyncio.sleep(0)
        return os.getpid()


@ray.remote(max_concurrency=2)
class ScopedThreaded(_Scoped):
    pass


@ray.remote
class ScopedOwnShutdown(_Scoped):
    def __ray_shutdown__(self) -> None:  # the program's own clean-up still runs
        with open(os.environ["SHUTDOWN_MARK"], "a") as f:
            f.write(f"{os.getpid()}\n")


@ray.remote(max_calls=1)  # (Ray's default for GPU tasks): the worker ends after each call
def once(n: int) -> int:
    for _ in range(n):
        with timer("once_step"):
            pass
    return os.getpid()


@ray.remote
def owner(n: int) -> int:
    """Makes an actor of its own: it ends when this task returns (its owner's handle goes)."""
    return ray.get(Scoped.remote().work.remote("owned", n))  # type: ignore[no-any-return]


@ray.remote(max_concurrency=2)
class Held:
    def hold(self) -> None:
        for _ in range(3):
            with timer("held_step"):
                pass
        time.sleep(60)  # busy when another process kills it

    def pid(self) -> int:
        return os.getpid()


@ray.remote
def kill_it(actor: Any) -> None:
    """``ray.kill`` from a worker of the run, not the driver (as Ray Train's controller actor
    ends its training workers)."""
    ray.kill(actor)


def _ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def endings(out: str, address: str | None) -> None:
    """Worker processes Ray ends on its own right after their last call: actors whose last
    handle goes (sync, async, threaded, one with its own ``__ray_shutdown__``), an actor
    owned by a task that returns, and a ``max_calls=1`` task's worker; and a busy actor
    another worker process kills with ``ray.kill``."""
    ray.init(num_cpus=2, **RAY_INIT)
    pids: dict[str, int] = {}
    with timer("endings"):
        for label, cls in (("sync", Scoped), ("async", ScopedAsync),
                           ("threaded", ScopedThreaded), ("own", ScopedOwnShutdown)):
            with timer(label):
                actor = cls.remote()  # type: ignore[attr-defined]
                pids[label] = ray.get(actor.work.remote(label, 7))
                del actor  # the program's last handle
        with timer("max_calls"):
            pids["once"] = ray.get([once.remote(5) for _ in range(2)])[0]
        with timer("owned"):
            ray.get(owner.remote(3))
        with timer("killed_elsewhere"):
            held = Held.remote()
            held_ref = held.hold.remote()
            pids["killed_elsewhere"] = ray.get(held.pid.remote())
            time.sleep(1.5)  # its pushes say busy: a call runs
            ray.get(kill_it.remote(held))
            try:
                ray.get(held_ref)
            except ray.exceptions.RayActorError:
                pass
        deadline = time.monotonic() + 30
        while not all(_ended(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
    ended = {label: _ended(pid) for label, pid in pids.items()}
    ray.shutdown()
    result(ended=ended)


def generators(out: str, address: str | None) -> None:
    """Generator calls (Ray's streaming generators: a task, an actor's generator method, an
    async actor's async generator method; and a generator task with ``num_returns=2``): their
    bodies run as the caller iterates, after the call has returned."""
    ray.init(num_cpus=2, **RAY_INIT)
    with timer("iteration"):
        sim, async_sim = Sim.remote(), AsyncSim.remote()
        with timer("stream"):
            streamed = [sum(ray.get(ref) for ref in call) for call in (
                stream.remote(4), sim.stream.remote(3), async_sim.stream.remote(2))]
            streamed.append(sum(ray.get(stream.options(num_returns=2).remote(2))))
        with timer("partly"):  # the caller stops early: the rest of the body still runs
            refs = stream.remote(3)
            first = ray.get(next(refs))
            del refs
        with timer("concurrent"):  # four calls of one async generator method in flight at once
            made = []
            for k in range(4):
                with timer(f"from_{k}"):
                    made.append(async_sim.labelled.remote(2, k))
            labelled = [sum(ray.get(ref) for ref in call) for call in made]
    ray.shutdown()
    result(streamed=streamed, first=first, labelled=labelled)


def _serve_app() -> Any:
    """Two Ray Serve deployments: an async ingress calling a sync model through its handle."""
    from ray import serve as ray_serve

    @ray_serve.deployment(ray_actor_options={"num_cpus": 0})
    class Model:
        def __call__(self, x: int) -> int:
            with timer("model_forward"):
                time.sleep(0.002)
            return x * 2

    @ray_serve.deployment(ray_actor_options={"num_cpus": 0})
    class Ingress:
        def __init__(self, model: Any) -> None:
            self.model = model

        async def __call__(self, x: int) -> int:
            await asyncio.sleep(0.001 * (x % 3))  # interleaved requests: none in a block yet
            with timer("ingress"):
                y = await self.model.remote(x)
            return int(y) + 1

    return Ingress.bind(Model.bind())


def serve(out: str, address: str | None) -> None:
    """Ray Serve: each handle call carries the caller's block to the replica, and the
    replica's own handle call to the next (Serve makes each Ray call later, from its router's
    event loop thread, and runs deployment code on a thread of its own)."""
    from ray import serve as ray_serve

    ray.init(num_cpus=2, **RAY_INIT)
    ray_serve.start(http_options={"location": "NoServer"})
    handle = ray_serve.run(_serve_app(), name="app", route_prefix=None)
    with timer("requests"):  # one at a time
        got = [handle.remote(i).result() for i in range(6)]
    with timer("together"):  # four in flight at once
        responses = [handle.remote(i) for i in range(4)]
        got += [response.result() for response in responses]
    ray_serve.shutdown()
    ray.shutdown()
    result(got=got)


def driver_killed(out: str, address: str | None) -> None:
    """The driver SIGKILLed under ``otel-rl run`` once it has taken its actors' blocks in and
    timed blocks of its own: the launcher counts what it held, the actors' blocks among them
    (they deliver only to the driver). Prints its facts before it dies."""
    from otel_rl._internal import mainledger

    ray.init(num_cpus=2, **RAY_INIT)
    with timer("doomed_driver"):
        sims = [Sim.remote() for _ in range(2)]
        ray.get([sim.step.remote(50) for sim in sims])
        mirror = mainledger._path(os.environ["OTEL_RL_RUN_ID"], os.getpid())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the driver's next drains take them in
            read = mainledger._read(mirror)
            if read is not None and read[0][1] >= 102:  # (slot 1: records taken in)
                break
            time.sleep(0.05)
        for _ in range(10):
            with timer("driver_step"):
                pass
        result(taken_in=read[0][1] if read is not None else None)
        os.kill(os.getpid(), signal.SIGKILL)


@ray.remote
def job_facts() -> dict[str, Any]:
    """What a worker process knows of its start: the job's runtime_env (empty: Ray started
    it without ``setup_worker.py``) and whether it joined the run."""
    joined = False
    if "otel_rl._internal.ray_support.calls" in sys.modules:
        joined = sys.modules["otel_rl._internal.ray_support.calls"].joined
    with timer("job_step"):
        pass
    return {"runtime_env": dict(ray.get_runtime_context().runtime_env or {}), "joined": joined,
            "pid": os.getpid()}


#: A second, plain driver on the instance the first one started (another job).
OTHER_JOB = """
import json, ray, sys
sys.path.insert(0, sys.argv[1])
from ray_workloads import job_facts
ray.init(address="auto", include_dashboard=False, log_to_driver=False)
print("OTHER " + json.dumps(ray.get([job_facts.remote() for _ in range(2)])), flush=True)
ray.shutdown()
"""


def raylet_hook(out: str, address: str | None) -> None:
    """A local instance with no runtime_env of the program's: the run's hook is in the
    raylet's environment, the job's runtime_env stays empty; another job's workers on the same
    instance do not join the run."""
    import subprocess

    from ray._private import ray_constants

    ray.init(num_cpus=2, **RAY_INIT)
    variable = ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    facts: dict[str, Any] = {"raylet_hook": raylet_env(variable), "left": os.environ.get(variable),
                             "job_env": dict(ray.get_runtime_context().runtime_env or {})}
    with timer("iteration"):
        with timer("ours"):
            facts["ours"] = ray.get([job_facts.remote() for _ in range(2)])
        with timer("other_job"):
            other = subprocess.run([sys.executable, "-c", OTHER_JOB,
                                    os.path.dirname(os.path.abspath(__file__))],
                                   capture_output=True, text=True, timeout=300)
    lines = [line for line in other.stdout.splitlines() if line.startswith("OTHER ")]
    facts["other"] = json.loads(lines[0][6:]) if lines else other.stderr[-2000:]
    ray.shutdown()
    result(**facts)


def hook_refused(out: str, address: str | None) -> None:
    """The GCS refuses the entry the raylet's hook names (stood in for by making the store
    raise): workers that could not start without it must not be what the program gets."""
    from ray._private import ray_constants

    from otel_rl._internal.ray_support import driver

    def refuse(self: Any) -> None:
        raise ConnectionError("the GCS refused the hook's entry")

    driver.Driver.export_raylet_hook = refuse  # type: ignore[method-assign]
    ray.init(num_cpus=2, **RAY_INIT)
    hook = raylet_env(ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR)
    with timer("iteration"):
        pids = ray.get([rollout.remote(2) for _ in range(2)])
    ray.shutdown()
    result(ran=len(pids), raylet_hook=hook)


SCENARIOS = {"raylet_hook": raylet_hook, "hook_refused": hook_refused, "calls": calls, "losses": losses, "multinode": multinode, "late": late,
             "endings": endings, "generators": generators, "serve": serve,
             "driver_killed": driver_killed}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
