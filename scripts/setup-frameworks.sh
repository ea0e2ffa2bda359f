#!/usr/bin/env bash
# Build the virtual environments of the real frameworks the end-to-end tests train with, in a
# cache outside the clone keyed by the pinned versions; fast when they are already there.
#   bash scripts/setup-frameworks.sh [sf|mlagents ...]   (default: both)
# Prints one line per venv: "<name> <path to its python>".
#
# Each venv holds the framework exactly as its users install it (torch from PyPI runs on CPU
# here). otel_rl itself is installed into them by the tests, with a plain `pip install`.
# A venv is used only once its stamp file exists, so an interrupted build is redone.
set -euo pipefail

CACHE_ROOT="${OTEL_RL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-rl}"
PY="${PYTHON:-python3}"
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
TORCH=2.5.1
SF=2.1.1
MLAGENTS=1.1.0

pip_in() {  # pip_in <venv> <pip args...>
    local venv="$1"; shift
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

build_sf() {
    local venv="$1"
    pip_in "$venv" "torch==$TORCH" "numpy<2" "sample-factory==$SF" "gymnasium<1.0"
}

build_mlagents() {
    local venv="$1"
    pip_in "$venv" "torch==$TORCH"
    # mlagents 1.1.0 declares Python <3.11 and pins what no longer builds there; the trainers
    # run on 3.11 with the dependency set below (known good).
    pip_in "$venv" --no-deps --ignore-requires-python "mlagents==$MLAGENTS" "mlagents-envs==$MLAGENTS"
    pip_in "$venv" numpy==1.23.5 protobuf==3.20.3 "cattrs<1.7" attrs pyyaml h5py tensorboard \
        Pillow onnx==1.15.0 huggingface-hub cloudpickle grpcio
}

ensure() {  # ensure <name> <key>
    local name="$1" key="$2" venv stamp
    venv="$CACHE_ROOT/venvs/$key"
    stamp="$venv/.otel-rl-complete"
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
[[ ${#targets[@]} -gt 0 ]] || targets=(sf mlagents)
for target in "${targets[@]}"; do
    case "$target" in
        sf) ensure sf "sf-$SF-torch-$TORCH-py$PYVER" ;;
        mlagents) ensure mlagents "mlagents-$MLAGENTS-torch-$TORCH-py$PYVER" ;;
        *) echo "setup-frameworks: unknown framework '$target' (sf, mlagents)" >&2; exit 2 ;;
    esac
done
