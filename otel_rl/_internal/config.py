"""One table of settings, resolved with one precedence rule.

argument > ``OTEL_RL_*`` > standard ``OTEL_*`` > default. An invalid argument raises
``ValueError`` (the caller made a mistake in code); a malformed environment value warns once and
falls back to the next source (a typo in a shell must not break a training run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from otel_rl._internal import log

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

SpanPolicy = Literal["all", "auto", "off"]
Protocol = Literal["grpc", "http/protobuf"]
Compression = Literal["gzip", "none"]
Histogram = Literal["explicit", "exponential"]
SPAN_POLICIES: tuple[SpanPolicy, ...] = get_args(SpanPolicy)
HISTOGRAMS: tuple[Histogram, ...] = get_args(Histogram)
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _parse_choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return low

    return parse


#: Largest count and number of seconds a setting may have. Far past any real use; what is
#: larger fails later where it is used (a wait of 1e20 s overflows the OS timer: a traceback in
#: the exporter's thread), so it is refused where it is read.
MAX_COUNT = 10**12
MAX_SECONDS = 1e9


def _parse_positive_int(text: str) -> int:
    value = int(text.strip())
    if not 0 < value <= MAX_COUNT:
        raise ValueError(f"expected a positive integer up to {MAX_COUNT:.0e}, got {text[:40]!r}")
    return value


def _parse_positive_float(text: str) -> float:
    value = float(text.strip())
    if not 0 < value <= MAX_SECONDS:  # NaN and infinity too: a wait of "inf" never ends
        raise ValueError(f"expected a positive number up to {MAX_SECONDS:.0e}, got {text[:40]!r}")
    return value


def _parse_histogram(text: str) -> str:
    """`explicit` / `exponential`, or the OTel SDK's names for them
    (``explicit_bucket_histogram``, ``base2_exponential_bucket_histogram``)."""
    low = text.strip().lower()
    low = {"explicit_bucket_histogram": "explicit",
           "base2_exponential_bucket_histogram": "exponential"}.get(low, low)
    if low not in HISTOGRAMS:  # short: the standard variable's name is long already
        raise ValueError("expected explicit or exponential")
    return low


def _parse_millis(text: str) -> float:
    return _parse_positive_float(text) / 1000.0


def _parse_nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a non-empty value")
    return text.strip()


def _parse_endpoint(text: str) -> str:
    """An OTLP endpoint: an http(s) URL with a host and a valid port, or ``host:port``
    (gRPC); ``none``/``off`` (no endpoint) pass. Checked here so that a malformed one is a
    warning naming its variable, not an export error later."""
    import urllib.parse

    value = _parse_nonempty(text)
    if value.lower() in ("none", "off"):
        return value
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError("expected a URL without spaces or control characters")
    if "://" in value:
        parts = urllib.parse.urlsplit(value)
        port = parts.port  # ValueError for a port out of range, not a number, bad IPv6
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http:// or https:// URL with a host")
    else:
        host, _, port_text = value.rpartition(":")
        if not host or not port_text.isdigit():
            raise ValueError("expected an http(s)://host:port URL or host:port")
        port = int(port_text)
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range")
    return value


#: Characters of an HTTP header name (RFC 9110 token).
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _parse_headers(text: str) -> dict[str, str]:
    """`parse_key_values`, for request headers: names are HTTP tokens, values hold no control
    characters (a CR/LF would be refused by every send, or split the request)."""
    headers = parse_key_values(text)
    for key, value in headers.items():
        check_header(key, value)
    return headers


def check_header(key: str, value: str) -> None:
    """Raise ValueError unless `key` is an HTTP header name and `value` has no control
    characters (what both HTTP and gRPC metadata can carry)."""
    if not key or not set(key) <= _TOKEN:
        raise ValueError(f"{key[:40]!r} is not a header name")
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in value):
        raise ValueError(f"the value of {key[:40]!r} holds control characters")


def _parse_index(text: str) -> int:
    value = int(text.strip())
    if not 0 <= value < 2**63:
        raise ValueError(f"expected a non-negative integer, got {text[:40]!r}")
    return value


#: The most niceness Linux gives a thread (`thread_nice`).
MAX_NICE = 19


def _parse_nice(text: str) -> int:
    value = int(text.strip())
    if not 0 <= value <= MAX_NICE:
        raise ValueError(f"expected an integer from 0 to {MAX_NICE}, got {text[:40]!r}")
    return value


def _parse_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of block names or fnmatch patterns (``forward,opt_*``)."""
    names = tuple(item.strip() for item in text.split(",") if item.strip())
    if not names:
        raise ValueError("expected block names or patterns, comma-separated")
    return names


def parse_key_values(text: str) -> dict[str, str]:
    """Parse the W3C-baggage-like ``k=v,k2=v2`` lists of ``OTEL_*_HEADERS`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` (values are URL-decoded)."""
    import urllib.parse

    result: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {item.strip()!r}")
        result[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return result


class _Setting:
    """One row of the table: name, environment variables (OTEL_RL_* first, then standard
    OTEL_* in precedence order), parser, default, meaning, a check for arguments, and whether
    the setting is carried to worker processes (which need it when they export on their own;
    secrets such as headers are not: carriers can end up in a child's environment)."""

    __slots__ = ("carried", "check", "default", "doc", "env", "name", "parse")

    def __init__(self, name: str, env: tuple[str, ...], parse: Callable[[str], Any], default: Any,
                 doc: str, check: Callable[[Any], Any] | None = None, *,
                 carried: bool = False) -> None:
        self.name, self.env, self.parse, self.default = name, env, parse, default
        self.doc, self.check, self.carried = doc, check, carried


def _check_choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value.lower()

    return check


def _check_positive(kind: type) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        limit = MAX_COUNT if kind is int else MAX_SECONDS
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
            raise ValueError(f"expected a positive number up to {limit:.0e}, got {value!r}")
        return kind(value)

    return check


def _check_nice(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NICE:
        raise ValueError(f"expected an integer from 0 to {MAX_NICE}, got {value!r}")
    return value


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected True or False, got {value!r}")
    return value


def _check_str(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _check_optional_str(value: Any) -> str | None:
    if value is None:
        return None
    return _check_str(value)


def _check_mapping(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return parse_key_values(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of strings, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def _check_names(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return _parse_names(value) if value.strip() else ()
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"expected block names or patterns (a list of strings), got {value!r}")
    return tuple(v.strip() for v in value)


def _check_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"expected a path, got {value!r}")
    return os.fspath(value)


def _check_compression(value: Any) -> str:
    if value is None:
        return "none"
    return _check_choice(COMPRESSIONS)(value)


TABLE: tuple[_Setting, ...] = (
    _Setting("service_name", ("OTEL_RL_SERVICE_NAME", "OTEL_SERVICE_NAME"), _parse_nonempty,
             None, "service.name of every span (else from OTEL_RESOURCE_ATTRIBUTES, else "
             "'unknown_service:python')", _check_str, carried=True),
    _Setting("endpoint", ("OTEL_RL_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                          "OTEL_EXPORTER_OTLP_ENDPOINT"), _parse_endpoint, None,
             "OTLP endpoint; unset means files only", _check_optional_str, carried=True),
    _Setting("protocol", ("OTEL_RL_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                          "OTEL_EXPORTER_OTLP_PROTOCOL"), _parse_choice(PROTOCOLS),
             "http/protobuf", "grpc or http/protobuf", _check_choice(PROTOCOLS), carried=True),
    _Setting("headers", ("OTEL_RL_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                         "OTEL_EXPORTER_OTLP_HEADERS"), _parse_headers, {},
             "extra request headers, k=v,k2=v2", _check_mapping),
    _Setting("compression", ("OTEL_RL_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
                             "OTEL_EXPORTER_OTLP_COMPRESSION"), _parse_choice(COMPRESSIONS),
             "none", "gzip or none", _check_compression, carried=True),
    _Setting("timeout", ("OTEL_RL_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                         "OTEL_EXPORTER_OTLP_TIMEOUT"), _parse_millis, 10.0,
             "seconds per export request (the OTEL_* variables are in milliseconds)",
             _check_positive(float), carried=True),
    _Setting("insecure", ("OTEL_RL_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
                          "OTEL_EXPORTER_OTLP_INSECURE"), _parse_bool, None,
             "gRPC without TLS (default: from the endpoint's scheme)", None, carried=True),
    _Setting("certificate", ("OTEL_RL_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                             "OTEL_EXPORTER_OTLP_CERTIFICATE"), _parse_nonempty, None,
             "CA certificate file for TLS", _check_optional_str, carried=True),
    _Setting("client_key", ("OTEL_RL_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                            "OTEL_EXPORTER_OTLP_CLIENT_KEY"), _parse_nonempty, None,
             "client private key for mTLS", _check_optional_str),
    _Setting("client_certificate", ("OTEL_RL_CLIENT_CERTIFICATE",
                                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"), _parse_nonempty,
             None, "client certificate for mTLS", _check_optional_str),
    _Setting("disabled", ("OTEL_RL_DISABLED", "OTEL_SDK_DISABLED"), _parse_bool, False,
             "no spans and no export; timers still aggregate", _check_bool),
    _Setting("resource_attributes", ("OTEL_RL_RESOURCE_ATTRIBUTES", "OTEL_RESOURCE_ATTRIBUTES"),
             parse_key_values, {}, "extra resource attributes, k=v,k2=v2", _check_mapping, carried=True),
    _Setting("output_dir", ("OTEL_RL_OUTPUT_DIR",), _parse_nonempty, None,
             "folder for timers.json and spans.otlp.jsonl (default when no endpoint: "
             "./otel-rl-runs/<run id>)", _check_path, carried=True),
    _Setting("run_id", ("OTEL_RL_RUN_ID",), _parse_nonempty, None,
             "identifies the run (default: time + random)", _check_str),
    _Setting("spans", ("OTEL_RL_SPANS",), _parse_choice(SPAN_POLICIES), "auto",
             "all | auto | off", _check_choice(SPAN_POLICIES), carried=True),
    _Setting("span_budget", ("OTEL_RL_SPAN_BUDGET",), _parse_positive_int, 10_000,
             "most spans in one trace under `auto`", _check_positive(int), carried=True),
    _Setting("sample_every", ("OTEL_RL_SAMPLE_EVERY",), _parse_positive_int, 10,
             "under `auto`: keep every Nth time window whole (plus windows with outliers)",
             _check_positive(int), carried=True),
    _Setting("window", ("OTEL_RL_WINDOW",), _parse_positive_float, 10.0,
             "under `auto`: seconds per time window (one trace per kept window)",
             _check_positive(float), carried=True),
    _Setting("max_buffer", ("OTEL_RL_MAX_BUFFER",), _parse_positive_int, 500_000,
             "most span records held before new ones are dropped (counted)",
             _check_positive(int), carried=True),
    _Setting("flush_interval", ("OTEL_RL_FLUSH_INTERVAL", "OTEL_BSP_SCHEDULE_DELAY"),
             _parse_positive_float, 2.0, "seconds between background flushes",
             _check_positive(float), carried=True),
    _Setting("batch_size", ("OTEL_RL_BATCH_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
             _parse_positive_int, 2048, "spans per export request (keeps gRPC under 4 MiB)",
             _check_positive(int), carried=True),
    _Setting("shutdown_timeout", ("OTEL_RL_SHUTDOWN_TIMEOUT",), _parse_positive_float, 5.0,
             "seconds shutdown may take, exporting included", _check_positive(float), carried=True),
    _Setting("timers_interval", ("OTEL_RL_TIMERS_INTERVAL",), _parse_positive_float, 60.0,
             "seconds between rewrites of timers.json during the run (a crash keeps the last)",
             _check_positive(float)),
    _Setting("handle_sigterm", ("OTEL_RL_HANDLE_SIGTERM",), _parse_bool, True,
             "on SIGTERM (no handler of the program's own), flush and write timers.json first",
             _check_bool),
    _Setting("count_if_killed", ("OTEL_RL_COUNT_IF_KILLED",), _parse_bool, False,
             "a small watcher process counts what the main process had not exported if it is "
             "killed without warning (SIGKILL, OOM); costs ~0.1-0.4 us per block (what "
             "`otel-rl run` always does)", _check_bool),
    _Setting("propagate", ("OTEL_RL_PROPAGATE",), _parse_bool, True,
             "instrument multiprocessing, executors, subprocess and threads", _check_bool, carried=True),
    _Setting("inherit_context", ("OTEL_RL_INHERIT_CONTEXT",), _parse_bool, True,
             "continue a trace handed down by a parent (TRACEPARENT)", _check_bool),
    _Setting("gpu_blocks", ("OTEL_RL_GPU_BLOCKS",), _parse_names, (),
             "blocks also timed on the GPU with CUDA events: names or patterns, "
             "comma-separated (e.g. forward,backward,update or opt_*)", _check_names, carried=True),
    _Setting("gpu_timeout", ("OTEL_RL_GPU_TIMEOUT",), _parse_positive_float, 10.0,
             "seconds a GPU-timed block's span waits for its GPU time before it is exported "
             "marked otel_rl.gpu.timed_out", _check_positive(float), carried=True),
    _Setting("metrics", ("OTEL_RL_METRICS",), _parse_bool, None,
             "export block-duration histograms, gauges and training scalars as OTLP metrics "
             "(default: on when an endpoint is set)", _check_bool, carried=True),
    _Setting("metrics_endpoint", ("OTEL_RL_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
             _parse_endpoint, None, "OTLP metrics endpoint, used as is (default: "
             "OTEL_EXPORTER_OTLP_ENDPOINT or the span endpoint, with /v1/metrics)",
             _check_optional_str, carried=True),
    _Setting("metrics_protocol", ("OTEL_RL_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"),
             _parse_choice(PROTOCOLS), None, "grpc or http/protobuf for metrics (default: "
             "the span protocol)", _check_choice(PROTOCOLS), carried=True),
    _Setting("metrics_headers", ("OTEL_RL_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS"),
             _parse_headers, None, "request headers for metrics (default: the span headers)",
             _check_mapping),
    _Setting("metrics_compression", ("OTEL_RL_METRICS_COMPRESSION",
                                     "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"),
             _parse_choice(COMPRESSIONS), None, "gzip or none for metrics (default: the span "
             "compression)", _check_compression, carried=True),
    _Setting("metrics_timeout", ("OTEL_RL_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"),
             _parse_millis, None, "seconds per metrics request (default: the span timeout)",
             _check_positive(float), carried=True),
    _Setting("metrics_histogram", ("OTEL_RL_METRICS_HISTOGRAM",
                                   "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"),
             _parse_histogram, "explicit", "block durations as explicit buckets (1, 2.5, 5 per "
             "decade, 1 us to 1000 s) or exponential (base 2, scale 3: Prometheus native "
             "histograms)", _check_choice(HISTOGRAMS), carried=True),
    _Setting("metrics_interval", ("OTEL_RL_METRICS_INTERVAL",), _parse_positive_float, 10.0,
             "seconds between metrics exports (cumulative: a lost export costs resolution only)",
             _check_positive(float), carried=True),
    _Setting("thread_nice", ("OTEL_RL_THREAD_NICE",), _parse_nice, 10,
             "niceness otel_rl's background threads run at above the program's (Linux: the "
             "flusher, the relay, the sinks), so that where cores are short the training's "
             "threads run first; 0 keeps them at the program's priority", _check_nice,
             carried=True),
    _Setting("accelerator", ("OTEL_RL_ACCELERATOR",), _parse_bool, True,
             "time blocks with the compiled hot path where it is built (false: pure Python, "
             "the same results)", _check_bool, carried=True),
    _Setting("worker_role", ("OTEL_RL_WORKER_ROLE",), _parse_nonempty, None,
             "role of this process when it is a worker", _check_optional_str),
    _Setting("worker_index", ("OTEL_RL_WORKER_INDEX",), _parse_index, None,
             "index of this worker within its role", None),
)

_BY_NAME = {s.name: s for s in TABLE}


def settings_doc(indent: str) -> str:
    """The table as a docstring list (`otel_rl.configure`'s), one item per setting."""
    items = []
    for s in TABLE:
        default = "" if s.default is None or s.default in ({}, ()) else f" Default ``{s.default!r}``."
        env = ", ".join(f"``{var}``" for var in s.env)
        items.append(_fill(f"- ``{s.name}`` ({env}): {s.doc}.{default}", 96, indent))
    return "\n".join(items)


def _fill(text: str, width: int, indent: str) -> str:
    """`text` (single-spaced) wrapped at spaces to `width` columns, later lines indented two
    more. Not `textwrap`: every process imports this module, and textwrap's import and
    regexes cost each one start-up milliseconds for a docstring."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}" if line else (indent if not lines else indent + "  ") + word
    return "\n".join([*lines, line])


#: Settings handed to worker processes in their carrier (the table's `carried` column).
CARRIED = tuple(s.name for s in TABLE if s.carried)


#: Every attribute of `Settings` with its default: the table's, plus what `resolve` derives.
_SETTINGS_DEFAULTS: dict[str, Any] = {
    **{s.name: s.default for s in TABLE}, "traces_endpoint_is_full": False, "exporters": (),
    "run_id_given": False,
}


class Settings:
    """Resolved settings (build with `resolve`). A plain class, not a dataclass: worker
    processes import this at start-up, and `dataclasses` costs milliseconds to import."""

    service_name: str
    endpoint: str | None
    traces_endpoint_is_full: bool
    #: The run id came from outside (argument, OTEL_RL_RUN_ID, `otel-rl run`), not made here.
    run_id_given: bool
    protocol: Protocol
    headers: dict[str, str]
    compression: Compression
    timeout: float
    insecure: bool | None
    certificate: str | None
    client_key: str | None
    client_certificate: str | None
    disabled: bool
    resource_attributes: dict[str, str]
    output_dir: str | None
    run_id: str
    spans: SpanPolicy
    span_budget: int
    sample_every: int
    window: float
    max_buffer: int
    flush_interval: float
    batch_size: int
    shutdown_timeout: float
    timers_interval: float
    handle_sigterm: bool
    count_if_killed: bool
    gpu_blocks: tuple[str, ...]
    gpu_timeout: float
    propagate: bool
    inherit_context: bool
    metrics: bool | None
    metrics_endpoint: str | None
    metrics_protocol: Protocol | None
    metrics_headers: dict[str, str] | None
    metrics_compression: Compression | None
    metrics_timeout: float | None
    metrics_histogram: Histogram
    metrics_interval: float
    thread_nice: int
    accelerator: bool
    worker_role: str | None
    worker_index: int | None
    exporters: tuple[SpanExporter, ...]

    def __init__(self, **values: Any) -> None:
        for name, default in _SETTINGS_DEFAULTS.items():
            value = values.pop(name, default)
            setattr(self, name, dict(value) if isinstance(value, dict) else value)
        if values:
            raise TypeError(f"unknown settings: {', '.join(sorted(values))}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={getattr(self, k)!r}" for k in _SETTINGS_DEFAULTS if k != "headers")
        return f"Settings({shown})"


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _from_env(setting: _Setting, environ: Mapping[str, str]) -> tuple[Any, str | None]:
    """The first well-formed environment value, and the variable it came from."""
    for var in setting.env:
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        try:
            return setting.parse(raw), var
        except ValueError as exc:
            # Bounded: a value can be any length, and its parser's message may repeat it.
            shown = repr(raw) if len(raw) <= 60 else f"{raw[:60]!r}... ({len(raw):,} characters)"
            reason = " ".join(str(exc).split())
            reason = reason if len(reason) <= 100 else reason[:99] + "…"
            _warn_once(var, f"otel_rl: ignoring {var}={shown}: {reason}")
    return None, None


def from_environment(name: str, environ: Mapping[str, str]) -> Any:
    """Setting `name` as the environment gives it (None: not set, or malformed and warned)."""
    return _from_env(_BY_NAME[name], environ)[0]


def new_run_id() -> str:
    """A fresh run id: start time and a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def run_file_name(run_id: str) -> str:
    """`run_id` (any string) as part of a file name: characters other than letters, digits
    and ``-_.`` become ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)


def run_folder(run_id: str) -> str:
    """The default output folder of run `run_id`: ``otel-rl-runs/<run id>``, one name inside
    it (``a/b`` or ``..`` must not leave the folder or nest in it)."""
    name = run_file_name(run_id)
    return os.path.join("otel-rl-runs", "_" if name.strip(".") == "" else name)


def resolve(arguments: Mapping[str, object], environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every setting: argument > OTEL_RL_* > OTEL_* > default."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    known = set(_SETTINGS_DEFAULTS)
    for name in arguments:
        if name not in known or name in ("traces_endpoint_is_full", "run_id_given"):
            raise ValueError(f"unknown otel_rl setting {name!r}")
    source_var: str | None = None
    for setting in TABLE:
        if setting.name in arguments and arguments[setting.name] is not None:
            value = arguments[setting.name]
            values[setting.name] = setting.check(value) if setting.check else value
            continue
        value, var = _from_env(setting, environ)
        if var is not None:
            values[setting.name] = value
            if setting.name == "endpoint":
                source_var = var
        elif setting.default is not None:
            values[setting.name] = setting.default
    exporters = arguments.get("exporters") or ()
    if not isinstance(exporters, (list, tuple)):
        raise ValueError("exporters must be a list of SpanExporter objects")
    for exporter in exporters:
        if not callable(getattr(exporter, "export", None)):
            raise ValueError(f"{exporter!r} is not a SpanExporter (no export method)")
    settings = Settings(**values, exporters=tuple(exporters))
    # The signal-specific variable is used as is; the generic one gets /v1/traces appended
    # (OTLP exporter spec), which the HTTP transport does.
    settings.traces_endpoint_is_full = source_var == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    if "service_name" not in values:
        settings.service_name = settings.resource_attributes.get(
            "service.name", "unknown_service:python"
        )
    settings.run_id_given = bool(settings.run_id)
    if not settings.run_id:
        settings.run_id = new_run_id()
    if settings.endpoint is not None and settings.endpoint.lower() in ("none", "off"):
        settings.endpoint = None
    if settings.metrics_endpoint is not None and settings.metrics_endpoint.lower() in ("none", "off"):
        settings.metrics_endpoint = None
    elif settings.metrics_endpoint is None and settings.traces_endpoint_is_full:
        # Spans go to a traces-specific URL: metrics go where the generic variable says
        # (OTLP exporter specification), with the signal's path.
        generic, _var = _from_env(_BY_NAME["endpoint"], {
            "OTEL_EXPORTER_OTLP_ENDPOINT": environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")})
        if generic and generic.lower() not in ("none", "off"):
            http = (settings.metrics_protocol or settings.protocol) == "http/protobuf"
            settings.metrics_endpoint = (generic.rstrip("/") + "/v1/metrics") if http else generic
    return settings

