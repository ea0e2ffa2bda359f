"""Aggregate spans: a process's cumulative whole-run tree inputs, carried by spans.

Whenever a process writes timers.json it emits, from the same snapshot, the inputs
`wholerun.build` makes timers.json from, as ``otel_rl.kind=aggregate`` spans in the run trace:
JSON, zlib-compressed, base64, cut into parts of `PART_CHARS` characters (Tempo truncates
attributes past 2 KB by default). `collect` reads them back from spans of any source and
`build` gives the tree — the timers.json the run wrote, whatever the span policy.

Payload kinds: ``"main"`` (the run's main process: ``local``, ``snapshots``, ``root_total``,
``gauges``, ``metadata``, as `wholerun.build` takes them) and ``"worker"`` (a process that
exports on its own: its snapshot, placed like a relayed worker's).
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from otel_rl._internal import jsonout, semconv
from otel_rl._internal.node import Gauge, json_default
from otel_rl._internal.shapes import GaugeDict
from otel_rl._internal.wholerun import Contribution, Snapshot

try:  # what hashlib.blake2b is, without hashlib's OpenSSL start-up (~3 ms in every process)
    from _blake2 import blake2b
except ImportError:  # a Python built without its own blake2
    from hashlib import blake2b

if TYPE_CHECKING:
    from otel_rl._internal.tree import Tree

PART_CHARS = 1900
NAME = "otel_rl aggregate"


def derive_trace_id(run_id: str, label: str) -> int:
    """The trace id every process of run `run_id` uses for `label` ("run", "w<k>")."""
    digest = blake2b(f"{run_id}\x00{label}".encode(), digest_size=16).digest()
    return int.from_bytes(digest, "big") or 1


def run_trace_id(run_id: str) -> int:
    return derive_trace_id(run_id, "run")


def run_span_id(run_id: str) -> int:
    """The run span's id, derived like the trace ids: a process that shares nothing with the
    main process but the run id (another torchrun node) can hang its spans under it."""
    digest = blake2b(f"{run_id}\x00run span".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def encode(payload: Mapping[str, object]) -> list[str]:
    """The payload as base64 parts of at most `PART_CHARS` characters."""
    raw = jsonout.dumps(payload, separators=(",", ":"), allow_nan=True,
                        default=json_default).encode()
    text = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
    return [text[i:i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]


#: Largest decompressed payload (a corrupt or forged span must not inflate without bound).
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024


def decode(parts: list[str]) -> dict[str, Any]:
    inflate = zlib.decompressobj()
    raw = inflate.decompress(base64.b64decode("".join(parts)), MAX_PAYLOAD_BYTES)
    if inflate.unconsumed_tail:
        raise ValueError("aggregate payload larger than the limit")
    return loads_deep(raw)


def loads_deep(raw: bytes) -> dict[str, Any]:
    """A JSON object otel_rl wrote (an aggregate, a relay snapshot), however deep its tree."""
    try:
        data: dict[str, Any] = json.loads(raw)
    except RecursionError:
        # Deeper than the C parser recurses: the readers' explicit-stack parser, with room for
        # a 10,000-deep tree (2 levels per block) inside the payload's own nesting.
        from otel_rl._internal.readers.boundary import Limits, parse_json

        data = parse_json(raw.decode("utf-8"), "aggregate", Limits(max_depth=50_000))
    return data


def span_attributes(source: str, seq: int, part: int, parts: int, final: bool, data: str,
                    kind: str) -> dict[str, Any]:
    return {semconv.KIND: semconv.KIND_AGGREGATE, semconv.AGGREGATE_SOURCE: source,
            semconv.AGGREGATE_SEQ: seq, semconv.AGGREGATE_PART: part,
            semconv.AGGREGATE_PARTS: parts, semconv.AGGREGATE_FINAL: final,
            semconv.AGGREGATE_PAYLOAD_KIND: kind, semconv.AGGREGATE_DATA: data}


def gauge_attributes(gauges: Mapping[str, GaugeDict]) -> dict[str, Any]:
    """Gauges as ``otel_rl.gauge.<name>.value|min|max|count`` attributes
    (`node.Gauge.to_attributes`)."""
    attrs: dict[str, Any] = {}
    for name, g in gauges.items():
        attrs.update(Gauge.from_dict(g).to_attributes(name))
    return attrs


class Collected:
    """The latest complete aggregate of each source found in a span set."""

    def __init__(self) -> None:
        # source -> seq -> {part: data}, plus (parts, final, kind) per (source, seq)
        self._parts: dict[str, dict[int, dict[int, str]]] = {}
        self._meta: dict[tuple[str, int], tuple[int, bool, str]] = {}

    def add(self, attributes: dict[str, Any]) -> None:
        """Take one aggregate span's attributes (others are ignored)."""
        if attributes.get(semconv.KIND) != semconv.KIND_AGGREGATE:
            return
        try:
            source = str(attributes[semconv.AGGREGATE_SOURCE])
            seq = int(attributes[semconv.AGGREGATE_SEQ])
            part = int(attributes[semconv.AGGREGATE_PART])
            parts = int(attributes[semconv.AGGREGATE_PARTS])
            data = str(attributes[semconv.AGGREGATE_DATA])
        except (KeyError, TypeError, ValueError):
            return
        final = attributes.get(semconv.AGGREGATE_FINAL) is True
        kind = str(attributes.get(semconv.AGGREGATE_PAYLOAD_KIND, "main"))
        self._parts.setdefault(source, {}).setdefault(seq, {})[part] = data
        self._meta[(source, seq)] = (parts, final, kind)

    def __bool__(self) -> bool:
        return bool(self._parts)

    def latest(self) -> tuple[list[tuple[dict[str, Any], bool, str]], list[str]]:
        """Per source, (payload, final, kind) of its latest complete aggregate; and notes."""
        result = []
        notes = []
        for source, seqs in sorted(self._parts.items()):
            for seq in sorted(seqs, reverse=True):
                parts, final, kind = self._meta[(source, seq)]
                got = seqs[seq]
                if len(got) < parts or any(i not in got for i in range(parts)):
                    continue
                try:
                    payload = decode([got[i] for i in range(parts)])
                except (ValueError, zlib.error):
                    continue
                if seq != max(seqs):
                    notes.append(f"the latest aggregate of {source} is incomplete; "
                                 f"used its aggregate #{seq}")
                result.append((payload, final, kind))
                break
            else:
                notes.append(f"no complete aggregate from {source}")
        return result, notes


#: Said when the main process's latest aggregate (or timers.json) is not its final one.
MAIN_UNFINISHED = ("the main process never finished (killed, or still running): the tree "
                   "holds what the run had recorded up to its last checkpoint")


def build(collected: Collected) -> tuple[Tree, list[str]]:
    """The whole-run tree from collected aggregates, and notes on what it lacks."""
    from otel_rl._internal import wholerun

    latest, notes = collected.latest()
    main = [p for p, _final, kind in latest if kind == "main"]
    # A worker's payload is its snapshot (see `Runtime.checkpoint`).
    workers: list[Snapshot] = [wholerun.received(p)  # type: ignore[arg-type]
                               for p, _final, kind in latest if kind != "main"]
    if any(not final for _p, final, kind in latest if kind == "main"):
        notes.append(MAIN_UNFINISHED)
    unfinished = sum(1 for _p, final, kind in latest if not final and kind != "main")
    if unfinished:
        notes.append(f"{unfinished} process(es) did not finish (killed, or still running): "
                     "the tree holds what they had recorded up to their last flush")
    if not main:
        notes.append("no aggregate from the run's main process: the root total is unknown")
        root_total = 0.0
        local: list[Contribution] = []
        snapshots: list[Snapshot] = []
        gauges: dict[str, GaugeDict] = {}
        metadata: dict[str, str] = {}
        places: list[list[object]] = []
        main_worker = None
    else:
        first = main[0]
        if len(main) > 1:
            notes.append(f"{len(main)} main processes share this run id")
        local, snapshots = list(first["local"]), list(first["snapshots"])
        wholerun.received_contributions(local)  # read from the span: trees as NodeDicts
        for snap in snapshots:
            wholerun.received(snap)
        root_total, gauges, metadata = first["root_total"], first["gauges"], first["metadata"]
        places = list(first.get("places") or [])
        main_worker = first.get("main")  # the run's own thread's role (`components.main_role`)
        notes.extend(str(note) for note in first.get("notes") or ())
    tree = wholerun.build(local=local, snapshots=[*snapshots, *workers], root_total=root_total,
                          gauges=gauges, metadata=metadata, places=places, main=main_worker)
    return tree, notes


def from_spans(spans: Iterable[Any]) -> Collected:
    collected = Collected()
    for span in spans:
        attributes = span.attributes
        if attributes.get(semconv.KIND) == semconv.KIND_AGGREGATE:
            collected.add(attributes)
    return collected
