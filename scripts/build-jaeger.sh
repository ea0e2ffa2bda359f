#!/usr/bin/env bash
# Build Jaeger v2 from the Go module proxy into a cache outside the clone, keyed by version.
# Prints the path of the binary on stdout; fast when it is already cached.
#
# Jaeger's v2.x tags are not valid Go module versions (the module path has no /v2), and its
# v1.x tags (dual tags of the same release commits, whose cmd/jaeger *is* Jaeger v2) carry a
# `replace` directive that `go install pkg@version` rejects. So the binary is built inside a
# throwaway wrapper module that requires Jaeger at the wanted version and repeats its replace
# directives. Candidates are tried in order; the first the proxy serves wins:
#   v1.76.1-0.20260720033334-798e4b0fcf22  = Jaeger v2.20.0 (pinned in BACKENDS.md)
#   v1.76.0                                 = Jaeger v2.13.0 (a tagged release)
set -euo pipefail

CANDIDATES="${OTEL_RL_JAEGER_MODULE_VERSIONS:-v1.76.1-0.20260720033334-798e4b0fcf22 v1.76.0}"
MODULE=github.com/jaegertracing/jaeger
CACHE_ROOT="${OTEL_RL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-rl}"

for version in $CANDIDATES; do
    if [[ -x "$CACHE_ROOT/jaeger/$version/jaeger" ]]; then
        echo "$CACHE_ROOT/jaeger/$version/jaeger"
        exit 0
    fi
done

if ! command -v go >/dev/null 2>&1; then
    echo "build-jaeger: 'go' (>= 1.25) is needed to build Jaeger" >&2
    exit 1
fi

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

build() {  # build <module-version> <output-binary>
    local version="$1" out="$2" work
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    local info gomod moddir
    info="$(cd "$work" && printf 'module otelrl.local/jaegerbuild\n\ngo 1.25\n' > go.mod \
        && go mod download -json "$MODULE@$version")" || return 1
    gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<< "$info")"
    moddir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<< "$info")"
    [[ -f "$gomod" ]] || return 1
    # The Jaeger v2 release of this module version, from its CHANGELOG ("v1.76.0 / v2.13.0"),
    # stamped into the binary so that `jaeger version` says which Jaeger it is.
    local release
    release="$(grep -m1 -oE "^${version} / v2\.[0-9]+\.[0-9]+" "$moddir/CHANGELOG.md" 2>/dev/null \
        | sed 's/.* \///; s/^ *//')" || true
    release="${release:-$version}"
    {
        printf 'module otelrl.local/jaegerbuild\n\ngo 1.25\n\nrequire %s %s\n\n' "$MODULE" "$version"
        # Jaeger's own replace directives, single-line and block forms.
        awk '/^replace \(/{b=1} b{print} b&&/^\)/{b=0} /^replace [^(]/{print}' "$gomod"
    } > "$work/go.mod"
    (cd "$work" && go get "$MODULE/cmd/jaeger@$version" >&2 \
        && go build -trimpath \
            -ldflags "-X $MODULE/internal/version.latestVersion=$release -X $MODULE/internal/version.commitSHA=module-$version" \
            -o "$out" "$MODULE/cmd/jaeger" >&2)
}

for version in $CANDIDATES; do
    dir="$CACHE_ROOT/jaeger/$version"
    mkdir -p "$dir"
    echo "build-jaeger: building Jaeger ($MODULE@$version) into $dir (10-20 min cold)" >&2
    tmp="$dir/jaeger.tmp.$$"
    if build "$version" "$tmp" || GOSUMDB=off build "$version" "$tmp"; then
        mv "$tmp" "$dir/jaeger"   # atomic: never half a binary in the cache
        echo "$dir/jaeger"
        exit 0
    fi
    rm -f "$tmp"
    echo "build-jaeger: $MODULE@$version could not be built; trying the next candidate" >&2
done
echo "build-jaeger: no Jaeger version could be built from the module proxy" >&2
exit 1
