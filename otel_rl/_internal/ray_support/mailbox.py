"""The run's mailbox in Ray's own key-value store: workers put their pushes, the driver takes.

The store is the GCS's internal KV, where Ray itself keeps exported functions and the job's
setup hook: every worker of every node reaches it, and so does a Ray Client driver (through
the client connection), with Ray's own addressing and authentication. So the run needs no
process of its own in the cluster: the collector actor this replaced was a whole Ray worker
process on the driver's node (~0.8 s of CPU to start on every run, and its memory), which the
GCS, already running, is not. Layout, in namespace `NAMESPACE`, under the run's `name`:

- ``<name>/p/<worker key>/<n>``: one push of one worker (`n`: the worker's own count,
  zero-padded, so a worker's pushes sort in the order it made them): `encode`'s bytes.
- ``<name>/state``: what the driver tells the workers, JSON: ``final`` (it asked for a last
  delivery) and ``drains`` (how many of its takes found something).

Bounded: a worker that has put `WORKER_CAP` bytes since the driver's last take puts only its
push's meta, marked ``refused`` (the driver counts the records lost), so a driver that stops
taking cannot fill the GCS. Every call is bounded in time where Ray's GCS client takes a
timeout (a driver or worker of the cluster; Ray Client's calls bring their own).
"""

from __future__ import annotations

import json
from typing import Any

#: The KV namespace of otel_rl's entries (none of Ray's own).
NAMESPACE = b"otel_rl"
#: Bytes one worker may have waiting (put since the driver's last take) before it refuses.
WORKER_CAP = 64 * 1024 * 1024
#: Digits of a push's number in its key (sorting as text sorts by number).
_DIGITS = 12


def _client() -> Any:
    """Ray's GCS client in this process, or None (a Ray Client driver)."""
    import ray.experimental.internal_kv as kv

    return kv.internal_kv_get_gcs_client()


class _Store:
    """The key-value calls the mailbox makes, in `NAMESPACE`: through Ray's GCS client, each
    bounded by `timeout`, where this process has one (a driver or worker of the cluster);
    through Ray Client's own calls otherwise."""

    __slots__ = ("_client", "_timeout")

    def __init__(self, timeout: float) -> None:
        self._client = _client()
        self._timeout = max(1, int(timeout + 0.999))

    def put(self, key: bytes, value: bytes) -> None:
        if self._client is not None:
            self._client.internal_kv_put(key, value, True, NAMESPACE, timeout=self._timeout)
        else:
            from ray.experimental.internal_kv import _internal_kv_put

            _internal_kv_put(key, value, namespace=NAMESPACE)

    def get(self, key: bytes) -> bytes | None:
        if self._client is not None:
            value = self._client.internal_kv_get(key, NAMESPACE, timeout=self._timeout)
        else:
            from ray.experimental.internal_kv import _internal_kv_get

            value = _internal_kv_get(key, namespace=NAMESPACE)
        return value  # type: ignore[no-any-return]

    def keys(self, prefix: bytes) -> list[bytes]:
        if self._client is not None:
            found = self._client.internal_kv_keys(prefix, NAMESPACE, timeout=self._timeout)
        else:
            from ray.experimental.internal_kv import _internal_kv_list

            found = _internal_kv_list(prefix, namespace=NAMESPACE)
        return sorted(found)

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes]:
        if self._client is not None:
            return self._client.internal_kv_multi_get(  # type: ignore[no-any-return]
                keys, NAMESPACE, timeout=self._timeout)
        return {key: value for key in keys if (value := self.get(key)) is not None}

    def delete(self, key: bytes, by_prefix: bool = False) -> None:
        if self._client is not None:
            self._client.internal_kv_del(key, by_prefix, NAMESPACE, timeout=self._timeout)
        else:
            from ray.experimental.internal_kv import _internal_kv_del

            _internal_kv_del(key, del_by_prefix=by_prefix, namespace=NAMESPACE)


def encode(meta: dict[str, Any], frames: list[bytes]) -> bytes:
    """A push as stored: its meta as one JSON line, then its frames (each says its length)."""
    return json.dumps(meta, separators=(",", ":")).encode() + b"\n" + b"".join(frames)


def decode(value: bytes) -> tuple[dict[str, Any], bytes]:
    """(meta, the frames' bytes) of a push `encode` made."""
    head, _, frames = value.partition(b"\n")
    meta = json.loads(head)
    if not isinstance(meta, dict):
        raise ValueError("a push's meta is not an object")
    return meta, frames


class Mailbox:
    """The run's entries in the GCS (see the module): one per run, named by the driver."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pushes = f"{name}/p/".encode()
        self._state = f"{name}/state".encode()

    # -- a worker -----------------------------------------------------------------------------
    def put(self, worker: str, n: int, meta: dict[str, Any], frames: list[bytes],
            timeout: float) -> None:
        """Store push number `n` of `worker` (its key: node id : pid)."""
        key = self._pushes + f"{worker}/{n:0{_DIGITS}d}".encode()
        _Store(timeout).put(key, encode(meta, frames))

    def state(self, timeout: float) -> dict[str, Any]:
        """What the driver says now (``final``, ``drains``); empty before it says anything."""
        value = _Store(timeout).get(self._state)
        state = json.loads(value) if value else {}
        return state if isinstance(state, dict) else {}

    # -- the driver ---------------------------------------------------------------------------
    def say(self, timeout: float, **state: Any) -> None:
        """Tell the workers `state` (the whole of it: ``final`` and ``drains``)."""
        _Store(timeout).put(self._state, json.dumps(state).encode())

    def take(self, timeout: float) -> list[tuple[str, bytes]]:
        """The pushes stored now, removed from the store: (worker key, `encode`'s bytes), each
        worker's in the order it made them. Only what was removed is returned: if a removal
        fails, the pushes from it on stay for the next take (none is read twice, none lost)."""
        store = _Store(timeout)
        keys = store.keys(self._pushes)
        values = store.get_many(keys) if keys else {}
        taken = []
        for key in keys:
            try:
                store.delete(key)
            except Exception:
                break
            value = values.get(key)
            if value is not None:
                worker = key[len(self._pushes):].rpartition(b"/")[0]
                taken.append((worker.decode("utf-8", "replace"), value))
        return taken

    def clear(self, timeout: float) -> None:
        """Remove every entry of the run (its end: what a worker puts after it is not read)."""
        _Store(timeout).delete(f"{self.name}/".encode(), by_prefix=True)
