#!/bin/sh
# bench_smoke.sh BUILD — every bench_mha mode once on a tiny shape: exit 0
# and no RESULT line carrying an error (the benchmark is not a timed test,
# but a mode whose calls the library refuses must not go unseen until the
# next `make bench`: variants-backward's were refused for two stops).
set -u
bin=${1:-build}/bench_mha
fails=0 checks=0
run() {
    checks=$((checks + 1))
    out=$("$bin" "$@" 2>&1); rc=$?
    if [ $rc -ne 0 ] || printf '%s\n' "$out" | grep -q 'error='; then
        fails=$((fails + 1))
        echo "FAIL bench_mha $*: exit $rc: $(printf '%s\n' "$out" | grep -m2 'error=' | cut -c1-300)"
    fi
}
small="--name smoke --B 1 --T 32 --d 32 --h 2 --reps 1 --budget 1 --threads 2"
run prefill $small --mha-only
run prefill $small --S 48 --mha-only
run backward $small --mha-only
run variants $small --mha-only
run variants-backward $small --mha-only
run decode --d 64 --h 4 --h-kv 2 --d-head 16 --L 64 --steps 2 --threads 2
run decode --d 64 --h 4 --h-kv 2 --d-head 16 --L 64 --steps 2 --threads 2 --int8 --v-fp16
run decode --d 64 --h 4 --h-kv 1 --d-head 16 --L 64 --steps 2 --threads 2 --weights int8
echo "bench_smoke: $checks modes, $fails failed"
[ $fails -eq 0 ]
