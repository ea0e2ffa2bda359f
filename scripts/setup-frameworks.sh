#!/usr/bin/env bash
# Build the virtual environments of the real frameworks the end-to-end tests train with, in a
# cache outside the clone keyed by the pinned versions; fast when they are already there.
#   bash scripts/setup-frameworks.sh [sf|mlagents|ray|otel-oldest|otel-newest ...]   (default: all)
# Prints one line per venv: "<name> <path to its python>".
#
# Each venv holds the framework exactly as its users install it (torch from PyPI runs on CPU
# here). otel_rl itself is installed into them by the tests, with a plain `pip install`.
# otel-oldest / otel-newest are small venvs (no torch) with the oldest and newest
# OpenTelemetry and protobuf otel_rl supports, for the install-range tests.
# A venv is used only once its stamp file exists and its check passes, so an interrupted or
# damaged build is redone.
set -euo pipefail

CACHE_ROOT="${OTEL_RL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-rl}"
PY="${PYTHON:-python3}"
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
TORCH=2.5.1
SF=2.1.1
MLAGENTS=1.1.0
RAY=2.60.0
OTEL_OLDEST=1.25.0
PROTOBUF_OLDEST=3.20.3
OTEL_NEWEST=1.45.2
PROTOBUF_NEWEST=7.36.2

pip_in() {  # pip_in <venv> <pip args...>
    local venv="$1"; shift
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

build_sf() {
    local venv="$1"
    pip_in "$venv" "torch==$TORCH" "numpy<2" "sample-factory==$SF" "gymnasium<1.0"
}

check_sf() {
    "$1/bin/python" -c "import torch, sample_factory.train, sf_examples.train_gym_env" 2>/dev/null
}

build_mlagents() {
    local venv="$1"
    # mlagents.torch_utils imports pkg_resources, which setuptools 81 removed.
    pip_in "$venv" "setuptools<81" "torch==$TORCH"
    # mlagents 1.1.0 declares Python <3.11 and pins what no longer builds there; the trainers
    # run on 3.11 with the dependency set below (known good).
    pip_in "$venv" --no-deps --ignore-requires-python "mlagents==$MLAGENTS" "mlagents-envs==$MLAGENTS"
    pip_in "$venv" numpy==1.23.5 protobuf==3.20.3 "cattrs<1.7" attrs pyyaml h5py tensorboard \
        Pillow onnx==1.15.0 huggingface-hub cloudpickle grpcio
}

check_mlagents() {
    "$1/bin/python" -W ignore -c "
import google.protobuf, numpy, mlagents.trainers.learn
assert google.protobuf.__version__ == '3.20.3' and numpy.__version__ == '1.23.5'" 2>/dev/null
}

build_ray() {
    # RLlib 2.60 wants gymnasium 1.x, Sample Factory gymnasium<1.0: each framework its own venv.
    # ray[client] (grpcio) for Ray Client: a driver connecting with ray.init("ray://...");
    # ray[serve] for Ray Serve's handle calls.
    pip_in "$1" "ray[rllib,client,serve]==$RAY" "torch==$TORCH"
}

check_ray() {
    "$1/bin/python" -W ignore -c "import torch, grpc, ray, ray.rllib.algorithms.ppo, ray.serve" \
        2>/dev/null
}

upgrade_ray() {  # a venv built before Ray Serve was added: only Serve's extras (no new torch)
    pip_in "$1" "ray[rllib,client,serve]==$RAY"
}

build_otel_oldest() {
    pip_in "$1" "opentelemetry-api==$OTEL_OLDEST" "opentelemetry-sdk==$OTEL_OLDEST" \
        "opentelemetry-exporter-otlp==$OTEL_OLDEST" "protobuf==$PROTOBUF_OLDEST" numpy==1.23.5
}

check_otel_oldest() {
    "$1/bin/python" -c "import opentelemetry.exporter.otlp.proto.grpc.trace_exporter" 2>/dev/null
}

build_otel_newest() {
    pip_in "$1" "opentelemetry-api==$OTEL_NEWEST" "opentelemetry-sdk==$OTEL_NEWEST" \
        "opentelemetry-exporter-otlp==$OTEL_NEWEST" "protobuf==$PROTOBUF_NEWEST" numpy
}

check_otel_newest() { check_otel_oldest "$@"; }

ensure() {  # ensure <name> <key>
    local name="$1" key="$2" venv stamp
    venv="$CACHE_ROOT/venvs/$key"
    stamp="$venv/.otel-rl-complete"
    if [[ -f "$stamp" ]] && ! "check_$name" "$venv"; then
        if declare -F "upgrade_$name" >/dev/null && "upgrade_$name" "$venv" \
                && "check_$name" "$venv"; then
            echo "setup-frameworks: $venv upgraded in place" >&2
        else
            echo "setup-frameworks: $venv fails its check; rebuilding" >&2
            rm -f "$stamp"
        fi
    fi
    if [[ ! -f "$stamp" ]]; then
        echo "setup-frameworks: building $venv (several minutes on a fresh machine)" >&2
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        "$PY" -m venv "$venv"
        pip_in "$venv" --upgrade pip setuptools wheel
        "build_$name" "$venv"
        touch "$stamp"
    fi
    echo "$name $venv/bin/python"
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(sf mlagents ray otel-oldest otel-newest)
for target in "${targets[@]}"; do
    case "$target" in
        sf) ensure sf "sf-$SF-torch-$TORCH-py$PYVER" ;;
        mlagents) ensure mlagents "mlagents-$MLAGENTS-torch-$TORCH-py$PYVER" ;;
        ray) ensure ray "ray-$RAY-client-torch-$TORCH-py$PYVER" ;;
        otel-oldest) ensure otel_oldest "otel-$OTEL_OLDEST-protobuf-$PROTOBUF_OLDEST-py$PYVER" ;;
        otel-newest) ensure otel_newest "otel-$OTEL_NEWEST-protobuf-$PROTOBUF_NEWEST-py$PYVER" ;;
        *) echo "setup-frameworks: unknown target '$target' (sf, mlagents, ray, otel-oldest, otel-newest)" >&2
           exit 2 ;;
    esac
done
