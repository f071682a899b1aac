#!/bin/sh
# bench/run.sh — what `make bench` runs: every configuration, libmha and its
# peers (PyTorch, ONNX Runtime, OpenBLAS) in the same run on the same number of threads,
# then bench/report.py prints the tables and writes bench/RESULTS.md.
#
#   sh bench/run.sh            full run (issue 3 prefill, issue 13 variants,
#                              issue 12 backward, issue 5 decode)
#   sh bench/run.sh --quick    tiny shapes for development; writes
#                              build/bench/RESULTS-quick.md instead
#   sh bench/run.sh --gemm     the projection GEMMs alone (mha_gemm paired
#                              with OpenBLAS, full shapes, ~2 min); writes
#                              build/bench/RESULTS-gemm.md
#   BENCH_THREADS=1 sh bench/run.sh   another thread count (default 2)
#   BENCH_QUIET_WAIT=0 BENCH_QUIET_WAIT_EACH=0 ...   do not wait for idle
#                              CPUs (full run: up to 90 s at the start and
#                              15 s before each measurement, 120 s in all)
#
# The configurations are listed once, here; bench_mha and peer_torch.py
# take the same flags.
set -u
cd "$(dirname "$0")/.."

mode=full
for a in "$@"; do
  case "$a" in
    --quick) mode=quick ;;
    --gemm) mode=gemm ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bench/run.sh: unknown argument '$a' (expected --quick or --gemm)" >&2; exit 2 ;;
  esac
done

threads=${BENCH_THREADS:-2}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
build=${BUILD:-build}
py=${PYTHON:-/usr/bin/python3}
bin=$build/bench_mha
out=$build/bench
mkdir -p "$out"
# Per-process file names: other engineers may run the benchmark in the same
# checkout at the same time, and their lines must not mix with ours.
raw=$out/raw-$mode.$$.txt
tmp=$out/.last.$$
: > "$raw"

if [ -n "${MAKELEVEL:-}" ]; then
  command="make bench${BENCH_ARGS:+ BENCH_ARGS=$BENCH_ARGS}"
else
  command="sh bench/run.sh $*"
fi
command="OMP_NUM_THREADS=$threads $command"

${MAKE:-make} -s --no-print-directory "$bin" || exit 1

# ------------------------------------------------------------ configurations
if [ "$mode" = quick ]; then
  results=$out/RESULTS-quick.md
  rounds=1; reps=3; budget=5
  fma_iters=2000000; stream_mib=16,64
  P1="--B 1 --T 128 --d 128 --h 4"
  P2="--B 1 --T 256 --d 128 --h 4 --causal"
  P3="--B 1 --T 64 --S 256 --d 128 --h 4"
  dec_d=512; dec_h=8; dec_hkv="8,2,1"; dec_L="256,1024"; dec_steps=5
else
  results=bench/RESULTS.md
  rounds=2; reps=5; budget=15
  fma_iters=20000000; stream_mib=64,256,1024
  P1="--B 4 --T 512 --d 768 --h 12"
  P2="--B 1 --T 4096 --d 768 --h 12 --causal"
  P3="--B 2 --T 256 --S 2048 --d 1024 --h 16"
  dec_d=2048; dec_h=32; dec_hkv="32,8,1"; dec_L="1024,4096,16384"; dec_steps=20
fi
dec_dhead=64; dec_cache="fp32,fp16,int8,int8/fp16" # int8/fp16: K int8, V fp16
# paired GEMM rounds (mha_gemm and OpenBLAS, one call of each per round)
gemm_rounds=$((reps * 3))
if [ "$mode" = gemm ]; then
  # the full shapes' GEMMs only: no prefill rounds, backward, variants or decode
  results=$out/RESULTS-gemm.md
  stream_mib=0; rounds=0; dec_hkv=""; dec_cache=""
fi

# Runs one command, appends its RESULT lines to the raw file; a failure is
# recorded and the run goes on, so one broken section does not hide the rest.
failed=0
run() {
  # before each measurement, wait a little (BENCH_QUIET_WAIT_EACH s) for
  # other processes to go quiet, and record how busy the CPUs were
  w=0
  b=$(cpu_busy)
  while [ "$b" -gt 15 ] && [ $w -lt "$quiet_each" ] && [ $waited_all -lt "$quiet_all" ]; do
    sleep 2; w=$((w + 3)); waited_all=$((waited_all + 3)); b=$(cpu_busy)
  done
  echo "+ $*" >&2
  stat0=$(cpu_jiffies); times > "$tmp.t0"
  "$@" > "$tmp"
  rc=$?
  stat1=$(cpu_jiffies); times > "$tmp.t1"
  load cmd "$b" $w "others_pct=$(others_pct "$stat0" "$stat1" "$tmp.t0" "$tmp.t1") cmd=\"$(label "$@")\" "
  cat "$tmp"
  cat "$tmp" >> "$raw"
  if [ $rc -ne 0 ]; then
    echo "RESULT kind=error rc=$rc cmd=\"$*\"" | tee -a "$raw"
    failed=1
  fi
}

# Load from other processes (a shared machine) is recorded, not hidden:
# busy percent of all CPUs over one second while this script sleeps.
cpu_busy() {
  set -- $(head -n 1 /proc/stat)
  shift
  a_tot=$(( $1 + $2 + $3 + $4 + $5 + $6 + $7 + $8 )); a_idle=$(( $4 + $5 ))
  sleep 1
  set -- $(head -n 1 /proc/stat)
  shift
  b_tot=$(( $1 + $2 + $3 + $4 + $5 + $6 + $7 + $8 )); b_idle=$(( $4 + $5 ))
  d=$(( b_tot - a_tot ))
  [ $d -gt 0 ] || d=1
  echo $(( 100 * (d - (b_idle - a_idle)) / d ))
}
load() {
  echo "RESULT kind=load phase=$1 busy_pct=$2 waited_s=${3:-0} ${4:-}loadavg=\"$(cut -d' ' -f1-3 /proc/loadavg)\"" >> "$raw"
}
# "program subcommand" of a command line, past env and its settings.
label() {
  while [ $# -gt 0 ]; do
    case "$1" in
      env|*=*) shift ;;
      -u) shift 2 ;;
      *) echo "$(basename "$1") ${2:-}"; return ;;
    esac
  done
}
# "busy total" jiffies of all CPUs since boot.
cpu_jiffies() {
  awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat
}
# Percent of the machine's CPU time that other processes used while one
# command ran: all busy jiffies minus the command's own CPU time (the
# shell's `times`, children's line), over all jiffies. High values mean the
# command's numbers were disturbed even if the CPUs were idle when it began.
# -1: the command was too short for 10 ms ticks to tell.
others_pct() {
  awk -v s0="$1" -v s1="$2" -v f0="$3" -v f1="$4" 'BEGIN {
    split(s0, a, " "); split(s1, b, " ")
    own = cpu(f1) - cpu(f0)
    tot = b[2] - a[2]
    if (tot < 100) { printf "-1"; exit }  # under 0.5 s of 2 CPUs: ticks too coarse
    o = (b[1] - a[1]) - own * 100
    if (o < 0) o = 0
    printf "%d", 100 * o / tot
  }
  function cpu(f,   line, n, t, i, p, m, sec) {
    n = 0; t = 0
    while ((getline line < f) > 0) {
      n++
      if (n != 2) continue
      split(line, p, " ")
      for (i = 1; i <= 2; i++) { split(p[i], m, "m"); sec = m[2]; sub(/s$/, "", sec); t += m[1] * 60 + sec }
    }
    close(f)
    return t
  }'
}

# Wait (up to BENCH_QUIET_WAIT seconds) for the other processes to finish:
# with 2 cores, one busy neighbour stalls every OpenMP barrier of 2 threads.
# The waits are capped so that a full run stays under ~8 minutes.
quiet_wait=${BENCH_QUIET_WAIT:-$([ "$mode" = quick ] && echo 0 || echo 90)}
quiet_each=${BENCH_QUIET_WAIT_EACH:-$([ "$mode" = quick ] && echo 0 || echo 15)}
quiet_all=120  # seconds of waiting before measurements, all together
waited_all=0
waited=0
busy=$(cpu_busy)
while [ "$busy" -gt 15 ] && [ $waited -lt "$quiet_wait" ]; do
  [ $waited -eq 0 ] && echo "bench: the CPUs are ${busy}% busy; waiting up to ${quiet_wait}s for quiet" >&2
  sleep 4
  waited=$((waited + 5))
  busy=$(cpu_busy)
done

start=$(date +%s)
echo "RESULT kind=run date=\"$(date -u '+%Y-%m-%d %H:%M UTC')\" command=\"$command\"" \
  "openblas_coretype_env=${OPENBLAS_CORETYPE:-unset}" >> "$raw"
load start "$busy" $waited
# libmha's side runs with OPENBLAS_NUM_THREADS=1 (OpenBLAS's idle pool would
# compete with its OpenMP threads); OpenBLAS is timed in its own processes.
solo="env OPENBLAS_NUM_THREADS=1"
# The paired GEMM processes: libgomp's workers and OpenBLAS's (default: spin
# for 2^28 cycles) go to sleep when their call ends (report.py: isolation).
gemm_isolation="OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4"
# shellcheck disable=SC2086
run $solo "$bin" machine --fma-iters $fma_iters --stream-mib $stream_mib
[ "$mode" = gemm ] || run "$py" bench/peer_torch.py --threads $threads info

# --------------------------------------------------- prefill (issue 3)
# mha and torch alternate for $rounds rounds, so both see the same spells of
# load from other processes; report.py merges the rounds' runs.
for name in P1 P2 P3; do
  eval "flags=\$$name"
  round=1
  while [ $round -le $rounds ]; do
    # the first round also dumps weights, inputs and libmha's output for ORT
    dump=""; [ $round -eq 1 ] && dump="--dump $out/ort-$name" && mkdir -p "$out/ort-$name"
    # shellcheck disable=SC2086
    run $solo "$bin" prefill --name $name $flags --reps $reps --budget $budget --threads $threads --mha-only $dump
    # ONNX Runtime on models built from the dump (checked against libmha first)
    # shellcheck disable=SC2086
    run "$py" bench/peer_ort.py --dir "$out/ort-$name" --name $name $flags \
        --reps $reps --budget $budget --threads $threads
    # shellcheck disable=SC2086
    run env -u OMP_WAIT_POLICY "$py" bench/peer_torch.py --threads $threads prefill --name $name $flags \
        --reps $reps --budget $budget
    # shellcheck disable=SC2086
    run env OMP_WAIT_POLICY=passive "$py" bench/peer_torch.py --threads $threads prefill --name $name $flags \
        --reps $reps --budget $budget
    round=$((round + 1))
  done
  # bf16 projections (issue 15): libmha's bf16 weights with
  # options.bf16_matmul (AMX where the CPU has it) and PyTorch's module in
  # bf16, next to each other
  if [ "$mode" != gemm ]; then
    # shellcheck disable=SC2086
    run $solo "$bin" prefill --name $name $flags --reps $reps --budget $budget --threads $threads --bf16
    # shellcheck disable=SC2086
    run env -u OMP_WAIT_POLICY "$py" bench/peer_torch.py --threads $threads prefill --name $name $flags \
        --reps $reps --budget $budget --bf16
  fi
  # The projection GEMMs, mha_gemm paired with OpenBLAS in one process per
  # OpenBLAS kernel set: the one it picks for this CPU (0.3.21 picks old
  # ones on CPUs it does not know), its AVX2 (Haswell) and its AVX-512
  # (SkylakeX) kernels. Both thread pools sleep as soon as their call ends,
  # so neither spins on the cores the other's next call needs.
  # (--gemm: one mha-only process for the table's "mha_gemm alone" column)
  # shellcheck disable=SC2086
  [ "$mode" = gemm ] && run $solo "$bin" prefill --name $name $flags --reps $reps --budget $budget \
      --threads $threads --mha-only
  cores="auto Haswell"
  grep -q avx512f /proc/cpuinfo && cores="$cores SkylakeX"
  for core in $cores; do
    # auto: OpenBLAS's own choice, even where the environment forces one
    # (some hosts export OPENBLAS_CORETYPE=Haswell to every process)
    coretype="-u OPENBLAS_CORETYPE"; [ "$core" = auto ] || coretype=OPENBLAS_CORETYPE=$core
    # shellcheck disable=SC2086
    run env $coretype $gemm_isolation "$bin" prefill --name $name $flags --reps $gemm_rounds \
        --budget $budget --threads $threads --gemm-only
  done
done

# --------------------------------------------------- backward (issue 12)
# A training step of one layer: mha_backward (and forward + backward) and
# torch's autograd on the same shapes, alternating for $rounds rounds;
# bench_mha also times the attention backward alone against the FMA peak.
bwd_reps=$([ "$mode" = quick ] && echo 2 || echo 3)
for name in P1 P2; do
  eval "flags=\$$name"
  round=1
  while [ $round -le $rounds ]; do
    # shellcheck disable=SC2086
    run $solo "$bin" backward --name $name $flags --reps $bwd_reps --budget $budget --threads $threads --mha-only
    for pol in "-u OMP_WAIT_POLICY" "OMP_WAIT_POLICY=passive"; do
      # shellcheck disable=SC2086
      run env $pol "$py" bench/peer_torch.py --threads $threads backward --name $name $flags \
          --reps $bwd_reps --budget $budget
    done
    round=$((round + 1))
  done
done

# ------------------------------------------- attention variants (issue 13)
# RoPE, ALiBi, softcap and sinks each on P2's layer, interleaved with the
# plain one in one process (report.py: overhead target <= 10%).
# shellcheck disable=SC2086
[ "$mode" = gemm ] || run $solo "$bin" variants --name P2 $P2 --reps $((reps * 2)) --budget $((budget * 2)) --threads $threads --mha-only
# the same for the fast backward (every variant's gradients, QK-norm too), on P1
# shellcheck disable=SC2086
[ "$mode" = gemm ] || run $solo "$bin" variants-backward --name P1 $P1 --reps $reps --budget $((budget * 2)) --threads $threads --mha-only
# today's layer trained from PyTorch: mha.nn.Attention against the same
# layer written in PyTorch (RoPE, RMS QK-norm, GQA h_kv 4, causal), P1's shape
# shellcheck disable=SC2086
[ "$mode" = gemm ] || run env OMP_WAIT_POLICY=passive "$py" bench/nn_modern_step.py $P1 --rounds $reps --threads $threads

# ---------------------------------------------------- decode (issue 5)
# torch and mha alternate per (cache dtype, h_kv) group of contexts. torch
# runs with the default OMP_WAIT_POLICY and with "passive" (its OpenMP pool
# and OpenBLAS's threads otherwise spin against each other on 2 cores);
# report.py keeps the faster of the two, for prefill as well.
# The torch peer stores fp32 or fp16 only: the int8 rows have no torch peer.
for cache in $(echo $dec_cache | tr , ' '); do
  case $cache in
    fp16) f16=--fp16 ;; int8) f16=--int8 ;; int8/fp16) f16="--int8 --v-fp16" ;; *) f16="" ;;
  esac
  for hkv in $(echo $dec_hkv | tr , ' '); do
    if [ "$cache" = fp32 ] || [ "$cache" = fp16 ]; then
      for pol in "-u OMP_WAIT_POLICY" "OMP_WAIT_POLICY=passive"; do
        # shellcheck disable=SC2086
        run env $pol "$py" bench/peer_torch.py \
            --threads $threads decode --d $dec_d --h $dec_h --d-head $dec_dhead \
            --h-kv $hkv --L $dec_L --cache $cache --steps $dec_steps
      done
    fi
    for L in $(echo $dec_L | tr , ' '); do
      # shellcheck disable=SC2086
      run $solo "$bin" decode --d $dec_d --h $dec_h --h-kv $hkv --d-head $dec_dhead --L $L $f16 \
          --steps $dec_steps --threads $threads
    done
  done
done

# bf16 / int8 weights (issue 15): the fp32-cache step at every h_kv and
# context with the projections stored in bf16 and int8; report.py sets
# them beside the fp32-weight rows above.
for wdtype in bf16 int8; do
  for hkv in $(echo $dec_hkv | tr , ' '); do
    for L in $(echo $dec_L | tr , ' '); do
      # shellcheck disable=SC2086
      run $solo "$bin" decode --d $dec_d --h $dec_h --h-kv $hkv --d-head $dec_dhead --L $L \
          --weights $wdtype --steps $dec_steps --threads $threads
    done
  done
done

# Issue 3's memory figure: peak RSS of a causal forward, B=1, T=32768,
# d_model=768, h=12, against the tensors it must hold.
if [ "$mode" = full ]; then
  ${MAKE:-make} -s --no-print-directory build/test_mha || exit 1
  run env MHA_TEST_ISA=auto MHA_TEST_MEMORY_T=32768 build/test_mha fast_memory_peak
fi

# The FMA peak again at the end: the spread shows how noisy the machine was.
# shellcheck disable=SC2086
run $solo "$bin" machine --fma-iters $fma_iters --stream-mib 0
end=$(date +%s)
load end "$(cpu_busy)"

rm -f "$tmp" "$tmp.t0" "$tmp.t1"
mv "$raw" "$out/raw-$mode.txt"
raw=$out/raw-$mode.txt
"$py" bench/report.py --raw "$raw" --out "$results" --command "$command" \
    --threads $threads --mode $mode --seconds $((end - start)) || failed=1
exit $failed
