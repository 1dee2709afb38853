#!/usr/bin/env bash
# After the test suite: no corral or engine the tests started may still run, in any PID namespace
# (this machine's /proc lists them all). Every process a test starts carries CORRAL_TEST_RUN=... in
# its environment (corral itself gets it as MARKER=CORRAL_TEST_RUN=...), so a corral run by hand
# is never taken for one. Kills what it finds, lists it, and exits 1 then.
set -uo pipefail
left=()
for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [[ $pid == "$$" ]] && continue
    state=$(awk '{print $3}' "$dir/stat" 2>/dev/null) || continue
    [[ $state == Z ]] && continue
    if { tr '\0' '\n' <"$dir/environ"; } 2>/dev/null | grep -q 'CORRAL_TEST_RUN=t'; then
        left+=("$pid")
    fi
done
if ((${#left[@]} == 0)); then
    echo "[check-leftovers] no process of the test suite is left"
    exit 0
fi
echo "[check-leftovers] FAILED: ${#left[@]} process(es) outlived the test suite:" >&2
for pid in "${left[@]}"; do
    printf '  %s (parent %s): %s\n' "$pid" "$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)" \
        "$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)" >&2
done
kill -9 "${left[@]}" 2>/dev/null
exit 1
