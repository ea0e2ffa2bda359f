#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then lint, type-check and test.
# Idempotent: on a machine that already ran it, it goes straight to the checks.
#   bash scripts/test.sh [pytest arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

echo "== Python packages"
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
# The real ML-Agents timers and Sample Factory Timing, as test oracles only. Their pinned
# releases declare older Pythons, but the modules the tests use need only the standard library
# (and psutil), so they are installed without their heavy dependency trees.
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --ignore-requires-python \
    mlagents-envs==1.1.0 sample-factory==2.1.1

echo "== Sample Factory, ML-Agents and OpenTelemetry-range venvs (cached in ~/.cache/otel-rl)"
# Fatal in CI (CI must train with both frameworks). Locally not: tests/frameworks/ runs it
# again and, if a venv cannot be built (no network, say), skips those tests with the reason.
if ! bash scripts/setup-frameworks.sh; then
    [ -z "${CI:-}" ] || { echo "setup-frameworks.sh failed" >&2; exit 1; }
    echo "setup-frameworks.sh failed: the framework tests will say why"
fi

echo "== Chromium (HTML report tests)"
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium chromium-driver
fi

echo "== Jaeger v2 (built from the Go module proxy, cached in ~/.cache/otel-rl)"
bash scripts/build-jaeger.sh

echo "== ruff"
"$PY" -m ruff check otel_rl tests benchmarks
echo "== mypy (strict on otel_rl/)"
"$PY" -m mypy

echo "== pytest (Python 3.10-3.13: scripts/python-matrix.sh)"
exec bash scripts/python-matrix.sh "$PY" "$@"
