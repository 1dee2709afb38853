#!/usr/bin/env bash
# After the test suite: no corral or engine the tests started may still run, in any PID namespace
# (this machine's /proc lists them all). scripts/test.sh gives the run an id, CORRAL_TEST_SUITE,
# which every process the tests start inherits, so neither a corral run by hand nor another
# checkout's test run is taken for one. Kills what it finds, lists it, and exits 1 then.
#   usage: check-leftovers.sh SUITE_ID
set -uo pipefail
suite=${1:?usage: check-leftovers.sh SUITE_ID}
# this script and the shells that ran it carry the id too
ours=" $$ "
p=$$
while p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) && [[ -n $p && $p != 0 ]]; do
    ours+="$p "
done
left=()
for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [[ $ours == *" $pid "* ]] && continue
    state=$(awk '{print $3}' "$dir/stat" 2>/dev/null) || continue
    [[ $state == Z ]] && continue
    if { tr '\0' '\n' <"$dir/environ"; } 2>/dev/null | grep -qx "CORRAL_TEST_SUITE=$suite"; then
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
