"""The carrier: how a block's context travels to another thread, process or program.

A carrier is a plain dict of strings (picklable, JSON-able): W3C ``traceparent`` /
``tracestate`` plus ``otel_rl`` (JSON: the block's tree path, its process and thread, the
parent's relay address, the run's clock offset and id, a share of the trace's span budget, the
settings a worker needs). In the environment it is ``TRACEPARENT``, ``TRACESTATE`` and
``OTEL_RL_CONTEXT``. This module writes and reads that format and nothing else (a leaf: it
imports no other otel_rl module but `log`), so the side that writes a carrier (`runtime`) and
the sides that read one (`runtime`, `propagation`) share one definition.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from otel_rl._internal import log

ENV_TRACEPARENT = "TRACEPARENT"
ENV_TRACESTATE = "TRACESTATE"
ENV_CONTEXT = "OTEL_RL_CONTEXT"

Carrier = dict[str, str]


class Context:
    """A parsed carrier: where in which trace a worker continues."""

    __slots__ = ("budget", "external", "index", "offset_ns", "path", "pid", "relay", "role",
                 "run_id", "run_span", "run_trace", "sampled", "settings", "span_id", "t0_ns",
                 "tid", "trace_id")

    def __init__(self, trace_id: int, span_id: int, sampled: bool) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.sampled = sampled
        self.path: tuple[str, ...] = ()
        self.pid = 0
        self.tid = 0
        self.relay: str | None = None
        self.offset_ns: int | None = None
        self.run_id: str | None = None
        self.budget: int | None = None
        self.role: str | None = None
        self.index: int | None = None
        self.run_trace: int | None = None
        self.run_span: int | None = None
        self.t0_ns: int | None = None  # the run's start (Unix ns): window 0 begins there
        #: Settings handed down by the parent (names of the table's `carried` rows).
        self.settings: dict[str, Any] = {}
        #: Only a traceparent, no otel_rl context: a trace from outside (a traced CI job).
        self.external = False


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_traceparent(value: str) -> tuple[int, int, bool] | None:
    """(trace id, span id, sampled) of a W3C ``traceparent``, or None if it is not one."""
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags_hex, 16) & 1)


def make(trace_id: int, span_id: int, sampled: bool, data: Mapping[str, object]) -> Carrier:
    """A carrier for span `span_id` of trace `trace_id`, with otel_rl's own `data`."""
    return {"traceparent": format_traceparent(trace_id, span_id, sampled), "tracestate": "",
            "otel_rl": json.dumps(data, separators=(",", ":"))}


def parse(carrier: Mapping[str, str]) -> Context | None:
    """The `Context` a carrier describes; None without a valid ``traceparent``. A malformed
    ``otel_rl`` part is ignored with a warning (the trace is still continued)."""
    parent = parse_traceparent(carrier.get("traceparent", "") or "")
    if parent is None:
        return None
    ctx = Context(*parent)
    extra = carrier.get("otel_rl")
    ctx.external = not extra
    if extra:
        try:
            data = json.loads(extra)
            ctx.path = tuple(str(p) for p in data.get("path", ()))
            ctx.pid = int(data.get("pid", 0))
            ctx.tid = int(data.get("tid", 0))
            ctx.relay = data.get("relay")
            ctx.offset_ns = data.get("offset")
            ctx.run_id = data.get("run_id")
            ctx.budget = data.get("budget")
            ctx.role = data.get("role")
            ctx.index = data.get("index")
            if data.get("run"):
                ctx.run_trace, ctx.run_span = (int(x, 16) for x in data["run"])
            if data.get("t0") is not None:
                ctx.t0_ns = int(data["t0"])
            settings = data.get("settings") or {}
            if not isinstance(settings, dict):
                raise TypeError("settings")
            for value, kinds in ((ctx.relay, str), (ctx.run_id, str), (ctx.role, str),
                                 (ctx.offset_ns, int), (ctx.budget, int), (ctx.index, int)):
                if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
                    raise TypeError("a field of the wrong type")
            ctx.settings = {str(k): v for k, v in settings.items() if v is not None}
        except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
            # RecursionError: JSON nested deeper than the parser recurses; OverflowError: a
            # number such as 1e999 where an integer belongs.
            log.warning("otel_rl: ignoring a malformed otel_rl context carrier (OTEL_RL_CONTEXT)")
            ctx = Context(*parent)
            ctx.external = True  # what is left is a plain traceparent
    return ctx


def from_env(environ: Mapping[str, str] | None = None) -> Carrier:
    """The carrier a parent put into this process's environment ({} if none)."""
    environ = os.environ if environ is None else environ
    carrier = {"traceparent": environ.get(ENV_TRACEPARENT, ""),
               "tracestate": environ.get(ENV_TRACESTATE, ""),
               "otel_rl": environ.get(ENV_CONTEXT, "")}
    return carrier if carrier["traceparent"] else {}


def to_env(carrier: Mapping[str, str], env: MutableMapping[str, str]) -> None:
    """Put `carrier` into the environment mapping `env` (for a child program)."""
    env[ENV_TRACEPARENT] = carrier["traceparent"]
    if carrier.get("tracestate"):
        env[ENV_TRACESTATE] = carrier["tracestate"]
    env[ENV_CONTEXT] = carrier["otel_rl"]
