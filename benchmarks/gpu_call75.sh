#!/usr/bin/env bash
# 2026-12-02, one H200: every bundled test binary on the GPU, four at a time (each within 300 s),
# after the embedding experiments' removal. The bundle of all 82 cc_test targets is 346 MB, over the
# 64 MiB a call carries, so it travels as one xz archive (19 MB; the binaries share their kernels):
#   ../shared/tools/gpu-bundle --flags "-c opt" $(./bazelw query 'tests(//...)')   (its cc_tests)
#   tar cf - .gpu | xz -6 --lzma2=dict=256MiB > .gpu_all.tar.xz    (carry [".gpu_all.tar.xz"])
# Prints one line per test (PASS / FAIL, its OK and SKIPPED counts, seconds) and "N passed, M
# failed"; each failing test's log goes to $OUT/logs.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/logs"
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(wc -l < .gpu/tests) tests"
one() {
  local t=$1 log s0 rc
  log=$(mktemp)
  s0=$(date +%s)
  # From .gpu/bin, as Bazel runs a test from its runfiles: tests that start comm/launch find it there.
  (cd .gpu/bin && timeout 300 ../run "$t") > "$log" 2>&1
  rc=$?
  if ((rc == 0)); then
    echo "PASS $t ($(grep -c '^\[       OK \]' "$log") ok, $(grep -c '^\[  SKIPPED \]' "$log") skipped, $(($(date +%s) - s0)) s)"
  else
    echo "FAIL $t rc=$rc ($(($(date +%s) - s0)) s): $(grep -E '^\[  FAILED  \]' "$log" | head -2 | tr '\n' ' ')"
    cp "$log" "$out/logs/$(echo "$t" | tr / _).log"
  fi
  rm -f "$log"
}
export -f one
export out
xargs -P 4 -I{} bash -c 'one {}' < .gpu/tests | tee "$out/results.txt"
echo "$(grep -c ^PASS "$out/results.txt") passed, $(grep -c ^FAIL "$out/results.txt") failed"
echo "== done $(date -u +%FT%TZ)"
