"""Jaeger/Tempo "servers" that do not speak HTTP properly, or too slowly.

`tests/test_fuzz_cli.py` sends hostile *bodies* through a real HTTP server; here the HTTP itself
is hostile (a raw loopback socket): a status line that is not HTTP, too many or too long header
lines, a body cut short of its Content-Length, broken chunked encoding, a server that trickles a
byte at a time. Each is one line, exit 5 (the backend is unavailable), within the timeout —
never an internal error, never a wait without end.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from otel_rl._internal.cli import main
from tests.test_fuzz_cli import base_timers

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _trickle_body(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(40):
        conn.sendall(b" ")
        time.sleep(0.2)


def _trickle_headers(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for i in range(40):
        conn.sendall(b"X-%d: a\r\n" % i)
        time.sleep(0.2)


ANSWERS: dict[str, Callable[[socket.socket], None]] = {
    "not HTTP": lambda c: c.sendall(b"HELLO THERE\r\n\r\n"),
    "more than 100 headers": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(200)) + b"\r\n{}"
    ),
    "a 100,000-byte header line": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 100_000 + b"\r\n\r\n{}"
    ),
    "body cut short": lambda c: c.sendall(
        b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"result": {"resourceSpans": []'
    ),
    "broken chunked encoding": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n"
    ),
    "closes at once": lambda c: None,
    "trickles the body": _trickle_body,
    "trickles the headers": _trickle_headers,
}


class _RawServer:
    def __init__(self) -> None:
        self.answer: Callable[[socket.socket], None] = ANSWERS["not HTTP"]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.answer(conn)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[_RawServer]:
    raw = _RawServer()
    yield raw
    raw.close()


@pytest.mark.parametrize("answer", list(ANSWERS))
@pytest.mark.parametrize("backend", ["--jaeger", "--tempo"])
def test_broken_http_from_a_backend_is_one_line_and_exit_5_within_the_timeout(
    server: _RawServer, answer: str, backend: str
) -> None:
    server.answer = ANSWERS[answer]
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["tree", backend, server.url, "--trace-id", TRACE, "--timeout", "1.5"])
    took = time.monotonic() - started
    lines = err.getvalue().splitlines()
    assert code == 5, err.getvalue()
    assert len(lines) == 1 and len(lines[0]) <= 200 and lines[0].startswith("otel-rl tree: cannot reach")
    assert out.getvalue() == ""
    assert took < 1.5 * 2 + 2  # Tempo may ask twice (v2, then the older API)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_collector_that_never_answers_costs_replay_twice_its_timeout_not_more(
    server: _RawServer, tmp_path: Path, protocol: str
) -> None:
    """Each request is retried within twice ``--timeout`` in all: at the default 10 s a silent
    collector is given up on in about 20 s, inside the 30 s a command may take (three full
    timeouts and the waits between them took 32 s)."""
    server.answer = lambda conn: time.sleep(8)  # reads the request, answers nothing
    timers = tmp_path / "timers.json"
    timers.write_text(json.dumps(base_timers()))
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["import", str(timers), "--endpoint", server.url, "--protocol", protocol,
                     "--timeout", "0.6"])  # fmt: skip
    took = time.monotonic() - started
    assert code == 5, err.getvalue()
    assert len(err.getvalue().splitlines()) == 1 and "could not send" in err.getvalue()
    assert took < 2 * 0.6 + 1.0, took
