#!/usr/bin/env bash
# The wheel, as users get it. Builds it ONCE with the standard PEP 517 build (`pip wheel
# --no-deps .`), builds the sdist and a wheel from that sdist (it must come out with the same
# name and files), checks the wheel with `auditwheel show`, then for Python 3.10, 3.11, 3.12
# and 3.13 (pyenv) installs it into a fresh venv with no Rust toolchain on PATH and runs, from
# a copy of tests/ away from the source tree: the packaging tests and the README demo without
# any extra, then the extras installed and, on 3.10 and 3.13, the unit tests with them.
# 3.10 and 3.13 get every dependency at its lower bound (.ci/floors.py), 3.11 and 3.12 the
# newest releases (the README test command runs the whole suite with the newest on 3.11; 3.13
# runs the code paths of 3.12 and newer, such as the server's eager handler start).
# Run by .ci/run; runs alone too: bash .ci/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
work=$(mktemp -d /tmp/narwhal-wheels.XXXXXX)
dist=$work/dist
tools=$work/tools
timings=()
step_started=$SECONDS
step_name=""

step() {  # step NAME: end the previous step (recording its time) and start NAME
    if [ -n "$step_name" ]; then timings+=("$(printf '%5d s  %s' $((SECONDS - step_started)) "$step_name")"); fi
    step_name=$1
    step_started=$SECONDS
    [ -z "$step_name" ] || echo "== wheels: $step_name"
}

fail() { echo "wheels: FAIL: $*" >&2; exit 1; }

without_rust() {  # PATH without any directory that holds cargo, rustc or rustup
    local dir out=""
    local IFS=:
    for dir in $PATH; do
        [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ] || [ -e "$dir/rustup" ] && continue
        out=${out:+$out:}$dir
    done
    printf '%s' "$out"
}

step "build tools (build, auditwheel) in a venv"
python3 -m venv "$tools"
"$tools/bin/pip" install -q build auditwheel

step "build the wheel: pip wheel --no-deps ."
"$tools/bin/pip" wheel -q --no-deps . -w "$dist"
wheels=("$dist"/*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one wheel, got: ${wheels[*]}"
wheel=${wheels[0]}
name=$(basename "$wheel")
case $name in
    narwhal-*-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl) ;;
    *) fail "wheel is not cp310-abi3 manylinux2014: $name" ;;
esac

step "build the sdist: python -m build --sdist"
"$tools/bin/python" -m build -q --sdist --outdir "$dist" . >/dev/null
sdists=("$dist"/*.tar.gz)
[ ${#sdists[@]} -eq 1 ] || fail "expected one sdist, got: ${sdists[*]}"

step "build a wheel from the sdist: pip wheel --no-deps narwhal-*.tar.gz"
"$tools/bin/pip" wheel -q --no-deps "${sdists[0]}" -w "$work/from-sdist"
from_sdist=("$work/from-sdist"/*.whl)
[ "$(basename "${from_sdist[0]}")" = "$name" ] || fail "sdist built ${from_sdist[0]}, not $name"
diff <(unzip -Z1 "$wheel" | sort) <(unzip -Z1 "${from_sdist[0]}" | sort) \
    || fail "the wheel built from the sdist holds other files"

step "auditwheel show"
audit=$("$tools/bin/auditwheel" show "$wheel" 2>&1)
echo "$audit"
grep -q '"manylinux_2_17_x86_64"' <<<"$audit" || fail "auditwheel does not accept manylinux_2_17"
echo "wheel: $name, $(stat -c %s "$wheel") bytes; sdist: $(stat -c %s "${sdists[0]}") bytes"

# The tests, away from the source tree (python/ is not copied): what they import and read
# (benches/harness for the sizing calibration test, the example configuration and docs/ for
# test_config, pyproject.toml for pytest's settings).
mkdir -p "$work/tree"
cp -r tests benches pyproject.toml narwhal.example.yaml docs "$work/tree/"
find "$work/tree" -name __pycache__ -prune -exec rm -rf {} +
python3 .ci/floors.py >"$work/floors.txt"
no_rust=$(without_rust)
tools_for_tests=(pytest pytest-timeout pytest-benchmark hypothesis openai)

for version in 3.10 3.11 3.12 3.13; do
    python=$(ls -d "$HOME"/.pyenv/versions/"$version".*/bin/python 2>/dev/null | sort -V | tail -n 1)
    [ -n "$python" ] || fail "no Python $version under ~/.pyenv/versions"
    venv=$work/py$version
    constraints=()
    bounds="newest dependencies"
    case $version in 3.10 | 3.13) constraints=(-c "$work/floors.txt"); bounds="lower bounds" ;; esac

    step "Python $version ($bounds): fresh venv, wheel without extras, no Rust on PATH"
    "$python" -m venv "$venv"
    (
        export PATH="$venv/bin:$no_rust"
        unset PYTHONPATH
        ! command -v cargo >/dev/null && ! command -v rustc >/dev/null \
            || fail "a Rust toolchain is on PATH"
        pip install -q --only-binary :all: "${constraints[@]}" "$wheel" "${tools_for_tests[@]}"
        cd "$work/tree"
        python - "$venv" <<'EOF'
import sys
from pathlib import Path

import narwhal
from narwhal import _narwhal_fast

venv = Path(sys.argv[1]).resolve()
for module in (narwhal, _narwhal_fast):
    assert venv in Path(module.__file__).resolve().parents, f"{module.__file__} not in {venv}"
try:
    import redis  # noqa: F401
except ImportError:
    pass
else:
    sys.exit("redis is installed without the narwhal[redis] extra")
EOF
        narwhal --version
        pytest -q -p no:cacheprovider tests/unit/test_packaging.py tests/e2e/test_demo.py
    )

    step "Python $version ($bounds): with narwhal[redis,otel] (the unit tests on 3.10, 3.13)"
    (
        export PATH="$venv/bin:$no_rust"
        unset PYTHONPATH
        # opentelemetry-proto: the OTLP exporter's tests decode what it sends with it
        pip install -q --only-binary :all: "${constraints[@]}" "$wheel[redis,otel]" \
            opentelemetry-proto
        pip freeze --exclude narwhal | tr '\n' ' ' && echo
        cd "$work/tree"
        python -c "import narwhal.fleet.ha, narwhal.observe.tracing, redis, opentelemetry.sdk"
        case $version in
            3.10 | 3.13)
                # test_layers reads the source tree (python/narwhal), not here by design
                pytest -q -p no:cacheprovider tests/unit --ignore tests/unit/test_layers.py ;;
        esac
    )
done
step ""

echo "== wheels: times"
printf '%s\n' "${timings[@]}"
echo "wheels: OK ($name on Python 3.10-3.13)"
rm -rf "$work"
