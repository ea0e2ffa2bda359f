"""Where otel_rl's CPU goes in the real Sample Factory run: per process and per component.

    python benchmarks/profile_sf.py [--rounds 1] [--steps 30000] [--rate 100] [--json FILE]

Runs Sample Factory 2.1.1 APPO on CartPole (2 rollout workers x 8 envs, CPU; the venv of
``scripts/setup-frameworks.sh sf``) plain and under ``otel-rl run`` (default settings), each
under ``py-spy record --subprocesses --nonblocking -f raw`` (needs ``pip install py-spy`` and
ptrace rights: root here). This checkout's otel_rl is put first on ``PYTHONPATH`` (nothing is
installed into the venv; ``--rev REV`` profiles otel_rl as of a git revision instead). Two
measurements per run:

- **CPU per process**: every 0.2 s the user + system ticks of each process of the tree are
  read from ``/proc/PID/stat``; the last reading per process counts (a process's final
  <0.2 s is missed). Processes are grouped by role (runner, rollout worker, learner, ...).
- **CPU per component**: py-spy's samples (non-idle threads, ``--rate`` per second). A sample
  is otel_rl's when, walking from the leaf up, an otel_rl frame comes before any frame of
  other third-party or program code (the standard library is transparent: ``json.dumps``
  called by the relay is the relay's); it goes to the component of that innermost otel_rl
  frame's module. A process's share of samples times its CPU gives seconds.

py-spy's own sampling runs in its own process (``--nonblocking``: the targets are not
paused); it is not counted in the per-process CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any

from _report import package_at_revision

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VENV = os.path.expanduser("~/.cache/otel-rl/venvs/sf-2.1.1-torch-2.5.1-py3.11")
TICK = os.sysconf("SC_CLK_TCK")

#: otel_rl module (path under otel_rl/) -> component, first match wins.
COMPONENTS = (
    ("_internal/recorder.py", "hot path (recorder)"),
    ("_internal/components.py", "SF component switch"),
    ("timing.py", "Timing bookkeeping (replaces SF's own)"),
    ("timers.py", "hot path (recorder)"),
    ("_internal/relay.py", "relay encode/decode"),
    ("_internal/relay_columns.py", "relay encode/decode"),
    ("_internal/ray_support", "relay encode/decode"),
    ("_internal/windows", "windows"),
    ("_internal/otlp/", "OTLP encoding"),
    ("_internal/sinks/file.py", "files"),
    ("_internal/jsonout.py", "files"),
    ("_internal/atomic.py", "files"),
    ("_internal/aggregates.py", "aggregates / trees"),
    ("_internal/tree", "aggregates / trees"),
    ("_internal/node.py", "aggregates / trees"),
    ("_internal/wholerun.py", "aggregates / trees"),
    ("_internal/placement.py", "aggregates / trees"),
    ("_internal/pipeline.py", "flush"),
    ("_internal/sinks/", "flush"),
    ("_internal/ledger", "flush"),
    ("_internal/metrics", "metrics"),
    ("_internal/cli", "CLI (otel-rl run, report)"),
    ("_internal/readers", "CLI (otel-rl run, report)"),
    ("renderers", "CLI (otel-rl run, report)"),
    ("", "other otel_rl (start-up, threads, runtime)"),
)
_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")
_RECORD = re.compile(r"(.*?) (\d+)\n", re.S)
#: Leaf frames of a thread that waits (py-spy's idle detection misses some of them).
_IDLE = re.compile(r"^(Condition\.wait|Event\.wait|.*select|poll|sleep|accept|recv.*|"
                   r"_wait_for_tstate_lock) \((threading|selectors|socket|multiprocessing/"
                   r"connection|time)\.py:")
#: A frame's file -> the Sample Factory role of the process it runs in.
_HINTS = (("rollout_worker.py", "rollout worker"), ("inference_worker.py", "inference worker"),
          ("learner_worker.py", "learner"), ("learner.py", "learner"),
          ("batcher.py", "batcher"))
_PROCESS = re.compile(r'process (\d+):"(.*?)";', re.S)


def component(path: str) -> str | None:
    """The component of a frame's file, None for program/third-party code, "" for stdlib."""
    if "otel_rl/" in path:
        rel = path.split("otel_rl/", 1)[1]
        return next(name for prefix, name in COMPONENTS if rel.startswith(prefix))
    if path.startswith("<frozen"):
        return ""
    if path.startswith("<") or "site-packages" in path:
        return None
    top = path.split("/", 1)[0].removesuffix(".py")
    return "" if top in _STDLIB else None


_STDLIB = set(sys.stdlib_module_names)


def role(cmdline: str) -> str:
    if "otel_rl run" in cmdline or "otel-rl run" in cmdline or "-m otel_rl" in cmdline:
        return "otel-rl CLI"
    if "spawn_main" in cmdline or "multiprocessing-fork" in cmdline:
        return "spawned worker"
    if "sf_examples" in cmdline:
        return "runner (main)"
    return "other"


class ProcWatch:
    """CPU seconds (user + system) of every descendant of `root`, polled from /proc."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.cpu: dict[int, float] = {}
        self.cmd: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _children(self) -> list[int]:
        parents: dict[int, list[int]] = defaultdict(list)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parents[int(fields[1])].append(int(entry))
            except (OSError, IndexError):
                continue
        out, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(parents.get(pid, ()))
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            for pid in self._children():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    # Read each time: a process may exec another program (pyenv's shim).
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                    if cmd:
                        self.cmd[pid] = cmd
                    self.cpu[pid] = (int(fields[11]) + int(fields[12])) / TICK
                except (OSError, IndexError, ValueError):
                    continue
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def parse_raw(path: str) -> dict[int, dict[str, Any]]:
    """py-spy raw output -> per pid: cmdline, samples, samples per component."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    procs: dict[int, dict[str, Any]] = {}
    for match in _RECORD.finditer(text):
        stack, count = match.group(1), int(match.group(2))
        # With --subprocesses each stack starts at the root process and names every process
        # down to the one sampled: the last `process PID:"cmdline"` frame is the sampled one.
        heads = list(_PROCESS.finditer(stack))
        if not heads:
            continue
        head = heads[-1]
        if _IDLE.match(stack.rsplit(";", 1)[-1]):
            continue  # a thread waiting that py-spy did not see as idle
        pid = int(head.group(1))
        proc = procs.setdefault(pid, {"cmd": head.group(2), "samples": 0,
                                      "components": defaultdict(int), "hints": defaultdict(int),
                                      "functions": defaultdict(int)})
        proc["samples"] += count
        frames = stack[head.end():].split(";")
        for hint, name in _HINTS:
            if hint in stack:
                proc["hints"][name] += count
                break
        owner = "training / framework"
        for frame in reversed(frames):
            m = _FRAME.match(frame)
            if m is None:
                continue
            kind = component(m.group(2))
            if kind is None:
                break
            if kind:
                owner = "otel_rl: " + kind
                where = f"{m.group(1)} ({m.group(2).split('otel_rl/', 1)[-1]})"
                proc["functions"][where] += count
                break
        proc["components"][owner] += count
    return procs


def one_run(variant: str, steps: int, rate: int, workdir: str, src: str = REPO
            ) -> dict[str, Any]:
    python = os.path.join(VENV, "bin", "python")
    command = ["-m", "sf_examples.train_gym_env", "--env=CartPole-v1", "--algo=APPO",
               "--num_workers=2", "--num_envs_per_worker=8", "--device=cpu",
               f"--train_for_env_steps={steps}", f"--experiment={variant}",
               f"--train_dir={workdir}/train", "--with_wandb=False", "--save_every_sec=100000",
               "--restart_behavior=overwrite"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OTEL_"))}
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    env["PYTHONPATH"] = src
    argv = [python, *command]
    out = os.path.join(workdir, f"otel-{variant}")
    if variant == "otel_rl":
        argv = [python, "-m", "otel_rl", "run", "--output", out, "--", "python", *command]
    raw = os.path.join(workdir, f"{variant}.raw")
    if rate:
        spy = shutil.which("py-spy") or "py-spy"
        argv = [spy, "record", "--subprocesses", "--nonblocking", "-r", str(rate), "-f", "raw",
                "-o", raw, "--", *argv]
    proc = subprocess.Popen(argv, cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    watch = ProcWatch(proc.pid)
    start = time.perf_counter()
    log = proc.communicate(timeout=1800)[0].decode(errors="replace")
    wall = time.perf_counter() - start
    watch.stop()
    match = re.findall(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)", log)
    checks = []
    if proc.returncode != 0 or not match or int(match[-1][0]) < steps:
        checks.append(f"{variant}: exit {proc.returncode} or steps missing: {log[-300:]!r}")
    if variant == "otel_rl" and not os.path.exists(os.path.join(out, "timers.json")):
        checks.append("otel_rl: no timers.json")
    samples = parse_raw(raw) if rate and os.path.exists(raw) else {}
    by_role: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    functions: dict[str, float] = defaultdict(float)
    for pid, cpu in watch.cpu.items():
        cmd = watch.cmd.get(pid, "")
        if (rate and pid == proc.pid) or "py-spy" in cmd.split(" ", 1)[0]:
            continue  # the profiler itself
        name = role(cmd)
        sampled = samples.get(pid)
        if name == "spawned worker" and sampled and sampled["hints"]:
            name = max(sampled["hints"].items(), key=lambda kv: kv[1])[0]
        counts[name] += 1
        by_role[name]["cpu_s"] += cpu
        if sampled and sampled["samples"]:
            for where, n in sampled["functions"].items():
                functions[where] += cpu * n / sampled["samples"]
        if sampled and sampled["samples"]:
            for owner, n in sampled["components"].items():
                by_role[name][owner] += cpu * n / sampled["samples"]
    return {"variant": variant, "wall_s": wall, "fps": float(match[-1][1]) if match else 0.0,
            "processes": dict(counts), "roles": {k: dict(v) for k, v in by_role.items()},
            "cpu_s": sum(v["cpu_s"] for v in by_role.values()), "checks": checks,
            "functions": dict(sorted(functions.items(), key=lambda kv: -kv[1])[:25]),
            "load_before": os.getloadavg()[0]}


def render(runs: list[dict[str, Any]]) -> str:
    lines = []
    for run in runs:
        lines += ["", f"#### {run['variant']}: {run['cpu_s']:.1f} CPU s all processes, "
                      f"FPS {run['fps']:.0f}, wall {run['wall_s']:.1f} s, "
                      f"load {run['load_before']:.2f} at start", "",
                  "| process (count) | CPU s | component | CPU s | share of process |",
                  "|---|---|---|---|---|"]
        for name, row in sorted(run["roles"].items(), key=lambda kv: -kv[1]["cpu_s"]):
            parts = sorted(((k, v) for k, v in row.items() if k != "cpu_s"),
                           key=lambda kv: -kv[1])
            first = True
            for owner, seconds in parts:
                if owner.startswith("otel_rl") or first:
                    label = f"{name} ({run['processes'].get(name, 0)})" if first else ""
                    cpu = f"{row['cpu_s']:.2f}" if first else ""
                    share = seconds / row["cpu_s"] if row["cpu_s"] else 0.0
                    lines.append(f"| {label} | {cpu} | {owner} | {seconds:.2f} | {share:.1%} |")
                    first = False
        total: dict[str, float] = defaultdict(float)
        for row in run["roles"].values():
            for owner, seconds in row.items():
                if owner.startswith("otel_rl"):
                    total[owner] += seconds
        if total:
            lines.append(f"| **all otel_rl** | | | **{sum(total.values()):.2f}** | "
                         f"{sum(total.values()) / run['cpu_s']:.1%} of all |")
            lines += ["", "| innermost otel_rl function, all processes | CPU s |", "|---|---|"]
            lines += [f"| `{where}` | {seconds:.3f} |"
                      for where, seconds in list(run["functions"].items())[:15]]
    return "\n".join(lines)


def render_ratios(runs: list[dict[str, Any]]) -> str:
    """Without py-spy (``--rate 0``): medians per variant and otel_rl / plain per round."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by[run["variant"]].append(run)
    lines = ["| run | FPS | CPU s, all processes | wall s |", "|---|---|---|---|"]
    for variant, rows in by.items():
        cells = []
        for key in ("fps", "cpu_s", "wall_s"):
            values = [r[key] for r in rows]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    if by.get("plain") and by.get("otel_rl"):
        cells = []
        for key in ("fps", "cpu_s", "wall_s"):
            pairs = list(zip(by["otel_rl"], by["plain"], strict=False))
            ratio = statistics.median(r[key] for r in by["otel_rl"]) / statistics.median(
                r[key] for r in by["plain"])
            spread = [o[key] / p[key] for o, p in pairs if p[key]]
            cells.append(f"**{ratio:.3f}×** ({min(spread):.3f}–{max(spread):.3f})")
        lines.append("| otel_rl / plain (per-round spread) | " + " | ".join(cells) + " |")
    loads = ", ".join(f"{r['load_before']:.1f}" for r in runs)
    return "\n".join([*lines, "", f"load average at each run's start: {loads}"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--rate", type=int, default=100,
                        help="py-spy samples per second; 0: no py-spy, report FPS and CPU ratios")
    parser.add_argument("--variants", default="plain,otel_rl")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--keep", metavar="DIR", help="copy py-spy's raw files here")
    parser.add_argument("--rev", help="profile otel_rl as of this git revision (default: the "
                        "checkout)")
    args = parser.parse_args()
    if args.rate and shutil.which("py-spy") is None:
        print("profile_sf: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 2
    runs = []
    with tempfile.TemporaryDirectory(prefix="otel-rl-profile-sf-") as workdir:
        src = REPO
        if args.rev:
            src = os.path.join(workdir, "src")
            os.makedirs(src)
            if not package_at_revision(args.rev, src):
                print(f"profile_sf: git cannot give otel_rl at {args.rev}", file=sys.stderr)
                return 2
        order = random.Random(0)
        for _ in range(args.rounds):
            variants = args.variants.split(",")
            order.shuffle(variants)
            for variant in variants:
                runs.append(one_run(variant, args.steps, args.rate, workdir, src))
                if args.keep and args.rate:
                    os.makedirs(args.keep, exist_ok=True)
                    shutil.copy(os.path.join(workdir, f"{variant}.raw"),
                                os.path.join(args.keep, f"{variant}-{len(runs)}.raw"))
                print(f"{variant}: CPU {runs[-1]['cpu_s']:.1f} s FPS {runs[-1]['fps']:.0f}",
                      flush=True)
    print(render(runs) if args.rate else render_ratios(runs))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=2)
    failed = [c for r in runs for c in r["checks"]]
    for c in failed:
        print("CHECK FAILED:", c)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
