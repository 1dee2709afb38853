#!/usr/bin/env bash
# Create (or reuse) the Python virtualenv for corral's client-side tests and
# install scripts/requirements-test.txt into it.
#
#   venv: ${CORRAL_VENV:-<repo>/.venv}
#
# Idempotent: a stamp file inside the venv records a hash of the requirements
# file and the interpreter; when it matches and the venv's python still runs,
# nothing is installed. The LAST line on stdout is the venv's python path; all
# progress goes to stderr.
#
# Environment:
#   CORRAL_VENV     venv location (default: <repo>/.venv)
#   PYTHON          interpreter used to create the venv (default: python3)
#   CORRAL_NO_APT=1 never call apt-get (python3-venv is installed via apt
#                   only when `python3 -m venv` is unusable)
set -Eeuo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd -P)"
REQS="$SCRIPT_DIR/requirements-test.txt"
VENV="${CORRAL_VENV:-$REPO_ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
VPY="$VENV/bin/python"
STAMP="$VENV/.corral-requirements.sha256"

log() { printf '[setup-python %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -f "$REQS" ]] || die "missing $REQS"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install python3 (>= 3.9)"

# What the venv must match: the requirements and the interpreter it was made from.
want="$(
    {
        cat "$REQS"
        "$PYTHON" -c 'import sys; print(sys.version); print(sys.base_prefix)'
    } | sha256sum | cut -d' ' -f1
)"

if [[ -x "$VPY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
    && "$VPY" -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ("openai", "pytest")))' >/dev/null 2>&1; then
    log "venv up to date: $VENV"
    printf '%s\n' "$VPY"
    exit 0
fi

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
    || die "$PYTHON is $("$PYTHON" --version 2>&1); need >= 3.9"

venv_ok() { "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; }
if ! venv_ok; then
    log "$PYTHON has no working venv/ensurepip module"
    if [[ "${CORRAL_NO_APT:-0}" != 1 ]] && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
        pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        log "apt-get install python${pyver}-venv"
        { DEBIAN_FRONTEND=noninteractive apt-get update -q \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "python${pyver}-venv" \
            || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv; } >&2 \
            || die "could not install python3-venv"
    fi
    venv_ok || die "$PYTHON cannot create virtualenvs; install python3-venv"
fi

# Recreate when the venv is missing, broken (its interpreter no longer runs)
# or was made from a different interpreter; otherwise just update packages.
recreate=0
if [[ ! -x "$VPY" ]] || ! "$VPY" -c 'pass' >/dev/null 2>&1; then
    recreate=1
else
    base_want="$("$PYTHON" -c 'import sys; print(sys.base_prefix, sys.version)')"
    base_have="$("$VPY" -c 'import sys; print(sys.base_prefix, sys.version)')"
    [[ "$base_want" == "$base_have" ]] || recreate=1
fi
if [[ $recreate == 1 ]]; then
    log "creating venv at $VENV with $("$PYTHON" --version 2>&1)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2 || die "python -m venv $VENV failed"
fi

rm -f "$STAMP"  # written again only after a successful install
log "installing $(grep -Ev '^\s*(#|$)' "$REQS" | tr '\n' ' ')"
"$VPY" -m pip install -q --disable-pip-version-check -r "$REQS" >&2 \
    || die "pip install -r $REQS failed"
"$VPY" -c 'import openai, pytest' >&2 || die "installed packages do not import"
printf '%s\n' "$want" >"$STAMP"
log "ready: openai $("$VPY" -c 'import openai; print(openai.__version__)'), pytest $("$VPY" -c 'import pytest; print(pytest.__version__)')"
printf '%s\n' "$VPY"
