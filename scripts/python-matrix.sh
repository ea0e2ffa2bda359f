#!/usr/bin/env bash
# Run the tests on every Python otel_rl supports, then print one line with the totals.
#   bash scripts/python-matrix.sh MAIN_PYTHON [pytest arguments...]
#
# First the other interpreters (OTEL_RL_PYTHONS, default "3.10 3.12 3.13"), each in its own
# venv without the framework trainings (`-m "not frameworks"`: the framework venvs are 3.11),
# then the full suite on MAIN_PYTHON (the interpreter scripts/test.sh set up), then a summary:
# one line per interpreter and, last, pytest's summary format with the totals of all of them,
# so whoever reads the last summary line reads every interpreter's result. The exit status is
# non-zero if any run failed.
#
# Interpreters come from pyenv (`pyenv prefix 3.13`), else `python3.13` on PATH. One that is
# missing is one line: a failure under CI (`CI` set), skipped locally. Each venv is cached in
# ~/.cache/otel-rl/venvs/ under the interpreter's version and a hash of the test dependencies
# (pyproject.toml's dependencies and `test`/`otlp` extras, plus the oracle pins below); otel_rl
# itself is not installed there: the tests import this checkout (PYTHONPATH) and load its
# pytest plugin with `-p otel_rl.testing`, as an installed otel_rl registers it. `-p no:otel_rl`
# first: the editable install of the main run leaves otel_rl.egg-info in the checkout, whose
# entry point (found through PYTHONPATH) would register the same module a second time.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
MAIN="$1"
shift
PYTHONS="${OTEL_RL_PYTHONS-3.10 3.12 3.13}"
CACHE_ROOT="${OTEL_RL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-rl}"
# The same oracle pins as scripts/test.sh (installed without their dependencies).
ORACLES="mlagents-envs==1.1.0 sample-factory==2.1.1"
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT

find_python() {  # find_python 3.13 -> path of an interpreter of that version, or nothing
    local v="$1" prefix
    if command -v pyenv >/dev/null 2>&1 && prefix="$(pyenv prefix "$v" 2>/dev/null)"; then
        [ -x "$prefix/bin/python$v" ] && { echo "$prefix/bin/python$v"; return 0; }
    fi
    command -v "python$v" 2>/dev/null
}

test_requirements() {  # the test dependencies, one per line, from pyproject.toml
    "$MAIN" - <<'EOF'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
for req in project["dependencies"] + extras["otlp"] + extras["test"]:
    if not re.match(r"otel-rl\b", req):
        print(req)
EOF
}

ensure_venv() {  # ensure_venv <python> <version> -> path of a ready venv (built if needed)
    local py="$1" version="$2" reqs key venv
    reqs="$(test_requirements)" || return 1
    key="$(printf '%s\n%s\n' "$reqs" "$ORACLES" | sha256sum | cut -c1-12)"
    venv="$CACHE_ROOT/venvs/tests-py$version-$key"
    mkdir -p "$CACHE_ROOT/venvs"
    (
        flock 9  # one build at a time (two checkouts testing at once)
        [ -e "$venv/.otel-rl-complete" ] && exit 0
        echo "python-matrix: building $venv" >&2
        rm -rf "$venv"
        "$py" -m venv "$venv" >&2 &&
            # shellcheck disable=SC2086
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
                $(echo "$reqs" | tr '\n' ' ') >&2 &&
            # shellcheck disable=SC2086
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
                --no-deps --ignore-requires-python $ORACLES >&2 &&
            touch "$venv/.otel-rl-complete"
    ) 9>"$venv.lock" || return 1
    echo "$venv"
}

build_accel() {  # build_accel <python> <version>: build the compiled hot path in place for it
    # Tests import the checkout, so each interpreter needs its own build beside the source
    # (what `pip install` does). A failed build fails that interpreter's run under CI (CI
    # machines have a compiler); locally that run goes on with the pure-Python hot path.
    "$1" scripts/build_accel.py && return 0
    if [ -n "${CI:-}" ]; then
        echo "python-matrix: cannot build the compiled hot path for Python $2: FAILED under CI"
        echo "python-$2 nobuild 0" >>"$LOGS/results"
        return 1
    fi
    echo "python-matrix: cannot build the compiled hot path for Python $2: pure Python"
}

run_logged() {  # run_logged <label> <command...>: tee its output, record status and seconds
    local label="$1" start rc
    shift
    start="$(date +%s)"
    "$@" 2>&1 | tee "$LOGS/$label.log"
    rc="${PIPESTATUS[0]}"
    echo "$label $rc $(($(date +%s) - start))" >>"$LOGS/results"
}

for v in $PYTHONS; do
    if ! py="$(find_python "$v")" || [ -z "$py" ]; then
        if [ -n "${CI:-}" ]; then
            echo "python-matrix: Python $v not found (pyenv prefix $v; python$v): FAILED under CI"
            echo "python-$v missing 0" >>"$LOGS/results"
        else
            echo "python-matrix: Python $v not found (pyenv prefix $v; python$v): skipped"
        fi
        continue
    fi
    version="$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
    if ! venv="$(ensure_venv "$py" "$version")"; then
        echo "python-matrix: cannot build the Python $version test venv: FAILED"
        echo "python-$version novenv 0" >>"$LOGS/results"
        continue
    fi
    build_accel "$venv/bin/python" "$version" || continue
    echo "== pytest on Python $version (without the framework trainings; $venv)"
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" run_logged "python-$version" \
        "$venv/bin/python" -m pytest tests -p no:otel_rl -p otel_rl.testing "$@" \
        -m "not frameworks"
done

version="$("$MAIN" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
if build_accel "$MAIN" "$version"; then
    echo "== pytest on Python $version (the full suite)"
    run_logged "python-$version" "$MAIN" -m pytest tests "$@"
fi

# The pure-Python hot path on its own: every run above runs the hot path's tests on both
# paths (tests/fixtures/hot_path.py); this one runs them, and the processes they start, with
# the compiled one switched off as `OTEL_RL_ACCELERATOR=false` (or a compiler-less install) has it.
echo "== pytest on Python $version, pure-Python hot path (OTEL_RL_ACCELERATOR=false)"
# shellcheck disable=SC2046
OTEL_RL_ACCELERATOR=false run_logged "python-$version-pure" "$MAIN" -m pytest "$@" \
    -m "not frameworks" tests/test_accel.py $("$MAIN" -c '
import pathlib, sys
sys.path.insert(0, ".")
from tests.fixtures.hot_path import MODULES
print(" ".join(sorted(str(p) for p in pathlib.Path("tests").rglob("test_*.py") if p.stem in MODULES)))')

"$MAIN" - "$LOGS" <<'EOF'
import re, sys
from pathlib import Path

logs = Path(sys.argv[1])
KINDS = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings", "errors")
totals = dict.fromkeys(KINDS, 0)
seconds = 0.0
names, failed = [], False
print("== Python matrix")
for line in (logs / "results").read_text().splitlines():
    label, status, took = line.split()
    name = label.removeprefix("python-")
    names.append(name)
    if status in ("missing", "novenv", "nobuild"):
        failed = True
        totals["errors"] += 1
        print(f"  Python {name}: " + {"missing": "interpreter not found",
                                      "novenv": "test venv could not be built",
                                      "nobuild": "compiled hot path could not be built"}[status])
        continue
    seconds += float(took)
    lines = (logs / f"{label}.log").read_text(errors="replace").splitlines()
    summary = next((ln.strip(" =") for ln in reversed(lines)
                    if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)\b|no tests ran", ln)), "")
    for count, kind in re.findall(r"(\d+) (\w+)", summary):
        kind = {"error": "errors", "warning": "warnings"}.get(kind, kind)
        if kind in totals:
            totals[kind] += int(count)
    failed |= status != "0"
    print(f"  Python {name}: {summary or 'no summary line'} (exit {status}, {float(took):.0f} s)")
def counted(n, kind):  # pytest's words: "1 error", "2 warnings"
    return f"{n} {kind[:-1] if n == 1 and kind in ('errors', 'warnings') else kind}"


parts = [counted(totals[k], k) for k in KINDS if totals[k] or k in ("failed", "passed")]
print(f"===== {', '.join(parts)} in {seconds:.2f}s (Python {', '.join(names)}) =====")
sys.exit(1 if failed else 0)
EOF
