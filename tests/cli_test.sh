#!/bin/sh
# cli_test.sh — checks the `mha` command-line tool: help for every command,
# the demo's numbers (from the seeds' worked examples, derived by hand in
# the lesson), `mha shapes` counts (from the formulas, evaluated here with
# shell arithmetic), and every error path (exit code, one line on stderr
# starting "mha <cmd>: ", nothing on stdout).
#   usage: sh tests/cli_test.sh ./build/mha
# Exits non-zero when any check fails.
MHA=${1:?usage: sh tests/cli_test.sh PATH_TO_MHA}
[ -x "$MHA" ] || { echo "cli_test: '$MHA' is not an executable (build it first)" >&2; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
checks=0
fails=0

fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

# run ARGS...: runs mha, keeps stdout, stderr and the exit code
run() {
    "$MHA" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    last="mha $*"
}

# ok: the last run exited 0 with nothing on stderr
expect_ok() {
    checks=$((checks + 1))
    [ "$rc" -eq 0 ] || fail "$last: exit $rc, want 0; stderr: $(head -c 300 "$tmp/err")"
    [ -s "$tmp/err" ] && fail "$last: unexpected stderr: $(head -c 300 "$tmp/err")"
    return 0
}

# expect_error CODE PREFIX PATTERN: exit CODE, empty stdout, exactly one
# stderr line that starts with PREFIX and contains PATTERN (fixed string)
expect_error() {
    checks=$((checks + 1))
    [ "$rc" -eq "$1" ] || fail "$last: exit $rc, want $1"
    [ -s "$tmp/out" ] && fail "$last: stdout should be empty on error"
    lines=$(wc -l <"$tmp/err")
    [ "$lines" -eq 1 ] || fail "$last: stderr has $lines lines, want 1: $(cat "$tmp/err")"
    case "$(cat "$tmp/err")" in
    "$2"*) ;;
    *) fail "$last: stderr does not start with '$2': $(cat "$tmp/err")" ;;
    esac
    grep -F -q -e "$3" "$tmp/err" || fail "$last: stderr lacks '$3': $(cat "$tmp/err")"
}

# has TEXT: the last stdout contains the fixed string TEXT
has() {
    checks=$((checks + 1))
    grep -F -q -e "$1" "$tmp/out" || fail "$last: output lacks '$1'"
}

# row NAME FIELD...: a stdout line starting (after spaces) with NAME holds
# all the given whitespace-separated fields
row() {
    name=$1
    shift
    checks=$((checks + 1))
    line=$(grep -E "^ *$name( |$)" "$tmp/out" | head -n 1)
    [ -n "$line" ] || { fail "$last: no line for '$name'"; return; }
    for f in "$@"; do
        case " $(echo "$line" | tr -s ' ') " in
        *" $f "*) ;;
        *) fail "$last: line '$name' lacks '$f': $line" ;;
        esac
    done
}

# ------------------------------------------------------------ dispatcher
run --help
expect_ok
has "usage: mha <command>"
has "demo"
has "shapes"
commands=$(sed -n '/^commands:/,/^$/p' "$tmp/out" | awk 'NF >= 2 && $1 != "commands:" {print $1}')
[ -n "$commands" ] || fail "mha --help lists no commands"

run -h
expect_ok
run
expect_error 2 "mha: " "missing command"
run frobnicate
expect_error 2 "mha: " "unknown command 'frobnicate'"
run help frobnicate
expect_error 2 "mha: " "unknown command 'frobnicate'"

# every listed command: --help works, an unknown flag is one usage line
for c in $commands; do
    run "$c" --help
    expect_ok
    has "usage: mha $c"
    run help "$c"
    expect_ok
    has "usage: mha $c"
    run "$c" --no-such-flag-xyz
    expect_error 2 "mha $c: " "unknown flag '--no-such-flag-xyz'"
done

# ------------------------------------------------------------ demo
run demo
expect_ok
# seed 000: the two-head trace
has "z_3 = Concat(z_3^(1), z_3^(2)) = [0.752, 0.752, -0.546, 0.926]"
has "z_3 I = [0.752, 0.752, -0.546, 0.926]"
has "y_3 = z_3 W_O = [0.479, 1.215, -0.170, 1.302]"
has "z_3' W_O'  (both swapped) = [0.479, 1.215, -0.170, 1.302]"
has "z_3' W_O   (only Z swapped) = [-0.170, 1.302, 0.479, 1.215]"
# ablation: 0.5 * 0.752 = 0.376; head 2's contribution = [-0.546*0.5, 0.926*0.5, -0.546, 0.926]
has "z_3 with head 2 zeroed = [0.752, 0.752, 0.000, 0.000]"
has "y_3 ablated = [0.752, 0.752, 0.376, 0.376]"
has "y_3 - y_3 ablated = [-0.273, 0.463, -0.546, 0.926]"
has "head 2: z_3^(2) W_O[2] = [-0.273, 0.463, -0.546, 0.926]"
# exercise Q1 and the lesson example
has "concatenation = [1.000, -2.000, 3.000, 4.000]"
has "third coordinate of the output: 3.000"
has "Projected    = [4.000, 6.000, -2.000, -2.000]"
has "with W = I   = [1.000, 2.000, 3.000, 4.000]"
has "average           = [2.000, 3.000]"
# pair B = heads swapped: sums same, differences flip sign; pair C: equal heads
has "concatenation W   = [4.000, 6.000, 2.000, 2.000]"
has "concatenation W   = [4.000, 6.000, 0.000, 0.000]"
# shapes: d_model 8, 2 heads, n = 3; 768 / 12 = 64
row "head 1 output Z\^\(1\)" "(3," "4)"
row "Z = Concat\(Z\^\(1\), Z\^\(2\)\)" "(3," "8)"
has "head width d_k = 64"
# full layer: contract
has "mismatch in W_O row blocks at head position 0: expected label 0, found 1"
# variants: the paper's slopes for 4 heads travel with permute_heads [2, 0, 3, 1]
has "slopes = [0.250, 0.062, 0.016, 0.004]"
has "slopes = [0.016, 0.250, 0.004, 0.062]"
has "check: the contract check reports the score-parameter block: ok"
has "Y(halves, moved W_Q/W_K) equals Y(interleaved): max |diff|"
has "all "
checks=$((checks + 1))
n_checks=$(grep -c "check: " "$tmp/out")
[ "$n_checks" -ge 20 ] || fail "demo printed $n_checks checks, want >= 20"
grep -q "FAILED" "$tmp/out" && fail "demo reports a failed check: $(grep FAILED "$tmp/out")"
grep -q -- "-0\.000" "$tmp/out" && fail "demo prints -0.000"

run demo extra
expect_error 2 "mha demo: " "unexpected argument 'extra'"
run demo --verbose
expect_error 2 "mha demo: " "unknown flag '--verbose'"

# ------------------------------------------------------------ shapes
# GPT-2 small: d_model 768, 12 heads, default T = S = 128, fp32 cache
run shapes --d-model 768 --heads 12
expect_ok
D=768 H=12 K=64 T=128
has "d_k=64 d_v=64"
row "W_Q" "(768," "768)" $((D * D))
row "W_O" "(768," "768)"
row "Q\^\(r\)" "(1," "128," "64)" $((T * K))
row "scores" "(1," "12," "128," "128)" $((H * T * T))
has "total parameters $((4 * D * D + 4 * D)) "
row "total FLOPs" $((4 * 2 * T * D * D + 2 * 2 * H * T * T * K))
row "MHA" 12 $((2 * T * H * K * 4)) "1.00x"
row "this" 12 $((2 * T * H * K * 4)) "1.00x"
row "MQA" 1 $((2 * T * 1 * K * 4)) "12.00x"

# the same with --flag=value gives the same output
cp "$tmp/out" "$tmp/out1"
run shapes --d-model=768 --heads=12
expect_ok
checks=$((checks + 1))
cmp -s "$tmp/out" "$tmp/out1" || fail "--flag=value and --flag value differ"

# GQA, fp16 cache: 32 heads share 8 kv heads of width 128
run shapes --d-model 4096 --heads 32 --kv-heads 8 --tokens 4096 --bytes 2 --batch 2
expect_ok
B=2 T=4096 K=128
has "h_kv=8 (GQA)"
row "K" "(2," "4096," "1024)"
row "MHA" 32 $((2 * B * T * 32 * K * 2)) "1.00x"
row "this" 8 $((2 * B * T * 8 * K * 2)) "4.00x"
row "MQA" 1 $((2 * B * T * 1 * K * 2)) "32.00x"

row "scores Q" $((2 * B * 32 * T * T * K))
row "weighted" $((2 * B * 32 * T * T * K))

# K int8, V fp16: K 1 byte + V 2 bytes per element; mha_cache bytes add one
# fp32 scale per 32 K values (K 128 wide: 4 scales per key)
run shapes --d-model 4096 --heads 32 --kv-heads 8 --tokens 4096 --cache-dtype int8 --v-cache-dtype fp16
expect_ok
has "cache element 1 bytes (K), 2 bytes (V), int8 plus one fp32 scale per 32 values"
row "this" 8 $((T * 8 * K * 3)) "4.00x" 8390656 $((T * 8 * (K * 3 + 4 * 4)))
# --cache-dtype alone: both sides; it replaces --bytes
run shapes --d-model 4096 --heads 32 --kv-heads 8 --tokens 4096 --cache-dtype fp16 --bytes 4
expect_ok
row "this" 8 $((T * 8 * K * 4)) "4.00x"
run shapes --d-model 8 --heads 2 --v-cache-dtype int4
expect_error 2 "mha shapes: " "--v-cache-dtype expects one of fp32|fp16|int8, got 'int4'"

# d_k != d_v, cross-attention source of another width and length, no bias
run shapes --d-model 64 --heads 4 --d-k 8 --d-v 32 --d-kv-in 48 --tokens 10 --kv-tokens 7 --no-bias
expect_ok
row "KV" "(1," "7," "48)"
row "W_K" "(48," "32)" $((48 * 32))
row "W_V" "(48," "128)"
row "W_O" "(128," "64)"
has "total parameters $((64 * 32 + 48 * 32 + 48 * 128 + 128 * 64)) "
row "this" 4 $((7 * 4 * (8 + 32) * 4))
row "scores Q" $((2 * 4 * 10 * 7 * 8))
row "weighted" $((2 * 4 * 10 * 7 * 32))
row "K projection" $((2 * 7 * 48 * 4 * 8))
has "K 32 + V 128 bytes"

# a separate value source of its own width (PyTorch vdim != kdim)
run shapes --d-model 64 --heads 4 --d-k 8 --d-v 32 --d-kv-in 48 --d-v-in 40 --tokens 10 --kv-tokens 7 --no-bias
expect_ok
row "V source" "(1," "7," "40)"
row "W_V" "(40," "128)" $((40 * 128))
has "total parameters $((64 * 32 + 48 * 32 + 40 * 128 + 128 * 64)) "
row "V projection" $((2 * 7 * 40 * 4 * 32))

# usage errors: flag parsing
run shapes
expect_error 2 "mha shapes: " "missing required flag --d-model"
run shapes --d-model 768
expect_error 2 "mha shapes: " "missing required flag --heads"
run shapes --heads 12 --d-model
expect_error 2 "mha shapes: " "--d-model needs a value (an integer"
run shapes --d-model= --heads 12
expect_error 2 "mha shapes: " "--d-model needs a value"
run shapes --d-model --heads 12
expect_error 2 "mha shapes: " "--d-model needs a value"
run shapes --d-model abc --heads 12
expect_error 2 "mha shapes: " "--d-model expects an integer in [1, 1048576], got 'abc'"
run shapes --d-model 7.5 --heads 1
expect_error 2 "mha shapes: " "--d-model expects an integer"
run shapes --d-model 0 --heads 1
expect_error 2 "mha shapes: " "--d-model expects an integer in [1, 1048576], got '0'"
run shapes --d-model -8 --heads 1
expect_error 2 "mha shapes: " "got '-8'"
run shapes --d-model 99999999999999999999999 --heads 1
expect_error 2 "mha shapes: " "--d-model expects an integer"
run shapes --d-model 8 --heads 70000
expect_error 2 "mha shapes: " "--heads expects an integer in [1, 4096]"
run shapes --d-model 8192 --heads 5000
expect_error 2 "mha shapes: " "--heads expects an integer in [1, 4096], got '5000'"
run shapes --help
has "query heads h (an integer in [1, 4096], required)"
run shapes --d-model 8 --heads 2 --bytes 3
expect_error 2 "mha shapes: " "--bytes expects one of 4|2, got '3'"
run shapes --d-model 8 --heads 2 --tokens x
expect_error 2 "mha shapes: " "--tokens expects an integer"
run shapes --d-model 8 --heads 2 --heads 2
expect_error 2 "mha shapes: " "--heads given twice"
run shapes --d-model 8 --heads 2 --dmodel 8
expect_error 2 "mha shapes: " "unknown flag '--dmodel'"
run shapes --d-model 8 --heads 2 --kv-head=1
expect_error 2 "mha shapes: " "unknown flag '--kv-head'"
run shapes --d-model 8 --heads 2 -v
expect_error 2 "mha shapes: " "unknown flag '-v'"
run shapes --d-model 8 --heads 2 768
expect_error 2 "mha shapes: " "unexpected argument '768'"
run shapes --d-model 8 --heads 2 --no-bias=yes
expect_error 2 "mha shapes: " "--no-bias takes no value"
# "-h" as a flag's value is that value, not a request for help
run shapes --d-model -h --heads 2
expect_error 2 "mha shapes: " "--d-model expects an integer in [1, 1048576], got '-h'"
run shapes --heads 2 --d-model 8 -h
expect_ok
has "usage: mha shapes"

# usage errors found by the library (mha_config_resolve)
run shapes --d-model 768 --heads 10
expect_error 2 "mha shapes: " "heads"
run shapes --d-model 768 --heads 12 --kv-heads 5
expect_error 2 "mha shapes: " "heads"

# runtime error: counts beyond 64 bits are refused, not wrapped
run shapes --d-model 1048576 --heads 1 --batch 16777216 --tokens 1073741824
expect_error 1 "mha shapes: " "exceeds 64 bits"

echo "cli_test: $checks checks, $fails failures"
[ "$fails" -eq 0 ]
