#!/bin/bash
# trace_diff.py on two small traces written here: the layer numbers fold into one group, the
# largest difference is listed first, the per-thread totals are right, and a file that is not a
# trace is a clear error.
set -u
script="$1"
dir="${TEST_TMPDIR:-/tmp}"
cat > "$dir/a.json" <<'JSON'
{"traceEvents":[{"name":"thread_name","ph":"M","pid":0,"tid":0,"args":{"name":"compute"}},
{"name":"matmul @layers.0.feed_forward.w1","ph":"X","ts":0,"dur":1000,"pid":0,"tid":0},
{"name":"matmul @layers.1.feed_forward.w1","ph":"X","ts":1000,"dur":1000,"pid":0,"tid":0},
{"name":"swiglu @layers.0.feed_forward","ph":"X","ts":2000,"dur":500,"pid":0,"tid":0}]}
JSON
cat > "$dir/b.json" <<'JSON'
{"traceEvents":[{"name":"matmul @layers.0.feed_forward.w1","ph":"X","ts":0,"dur":1500,"pid":0,"tid":3},
{"name":"matmul @layers.1.feed_forward.w1","ph":"X","ts":0,"dur":500,"pid":0,"tid":0},
{"name":"swiglu @layers.0.feed_forward","ph":"X","ts":600,"dur":250,"pid":0,"tid":0}]}
JSON
out=$(python3 "$script" "$dir/a.json" "$dir/b.json") || { echo "FAIL: exit $?"; exit 1; }
echo "$out"
fail=0
check() { if ! grep -qE "$1" <<< "$out"; then echo "FAIL: expected a line matching: $1"; fail=1; fi; }
check '^compute +matmul @layers\.#\.feed_forward\.w# +2\.00 +0\.50 +-1\.50$'
check '^weight gradients +matmul @layers\.#\.feed_forward\.w# +0\.00 +1\.50 +\+1\.50$'
check '^compute +swiglu +0\.50 +0\.25 +-0\.25$'
check '^compute +\(total\) +2\.50 +0\.75 +-1\.75$'
first=$(sed -n 2p <<< "$out")
if ! grep -q "1.50" <<< "$first"; then echo "FAIL: the largest difference first, found: $first"; fail=1; fi
echo '[1, 2' > "$dir/bad.json"
err=$(python3 "$script" "$dir/bad.json" "$dir/b.json" 2>&1) && { echo "FAIL: a broken file passed"; fail=1; }
if ! grep -q "trace_diff: cannot read .*bad.json" <<< "$err"; then echo "FAIL: unclear error: $err"; fail=1; fi
exit $fail
