#!/usr/bin/env bash
# Build Prometheus (Apache-2.0) from the Go module proxy into a cache outside the clone, keyed
# by version. Prints the path of the binary on stdout; fast when it is already cached.
#   bash scripts/build-prometheus.sh            -> prometheus
#   OTEL_RL_PROMETHEUS_CMD=promtool bash ...    -> promtool (same module, same version)
#
# Unlike Jaeger, the module installs with a plain `go install pkg@version` (no wrapper module).
# The binary carries no version string (no ldflags) and no web UI assets; the HTTP API works.
set -euo pipefail

VERSION="${OTEL_RL_PROMETHEUS_VERSION:-v0.316.0}"
CMD="${OTEL_RL_PROMETHEUS_CMD:-prometheus}"
MODULE=github.com/prometheus/prometheus
CACHE_ROOT="${OTEL_RL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-rl}"
dir="$CACHE_ROOT/prometheus/$VERSION"

if [[ -x "$dir/$CMD" ]]; then
    echo "$dir/$CMD"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    echo "build-prometheus: 'go' is needed to build Prometheus" >&2
    exit 1
fi

mkdir -p "$dir"
# One build at a time (a test session and scripts/test.sh may ask together): wait for the
# other, then use what it built.
exec 9>"$dir/.build.lock"
flock 9
if [[ -x "$dir/$CMD" ]]; then
    echo "$dir/$CMD"
    exit 0
fi
work="$(mktemp -d "$dir/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "build-prometheus: building $MODULE/cmd/$CMD@$VERSION into $dir (about 5 min cold)" >&2
GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOSUMDB=off GOBIN="$work" \
    go install -trimpath "$MODULE/cmd/$CMD@$VERSION" >&2
mv "$work/$CMD" "$dir/$CMD"   # atomic: never half a binary in the cache
echo "$dir/$CMD"
