#!/usr/bin/env bash
# Every cc_test of the repository on the GPU machine, in one call.
#   here:  benchmarks/gpu_tests.sh pack     bundles all of them (gpu-bundle, -c opt) into .gpu/ and
#                                           packs that into .gpu_all.tar.xz (~19 MB; git-ignored)
#   there: benchmarks/gpu_tests.sh run      (carry [".gpu_all.tar.xz"]) unpacks it and runs the tests
# The bundle is ~360 MB, over the 64 MiB a call carries, but the binaries share their kernels, so xz
# with a dictionary wider than one binary packs it to ~19 MB (gzip: ~120 MB). `run` starts four tests
# at a time (each within 300 s) from the repository root, with the binaries the tests start (e.g.
# comm/launch) copied beside their sources, where a test run by Bazel finds them. It prints a line
# per test (PASS with its OK and SKIPPED counts, or FAIL with its first failures), then "N passed,
# M failed", and copies each failing test's log to $OUT/logs. First used 2026-12-02 (as gpu_call75.sh; benchmarks/README.md has the results).
set -u
case ${1:-} in
  pack)
    set -e
    # The tests, and the binaries they start (their data: comm/launch, trainer/elastic/toy_trainer, ...).
    ../shared/tools/gpu-bundle --flags "-c opt" $(./bazelw query 'tests(//...)' 2>/dev/null) \
      $(./bazelw query "kind('cc_binary rule', deps(tests(//...)) intersect //...)" 2>/dev/null)
    grep -qx '/.gpu_all.tar.xz' .git/info/exclude 2>/dev/null || echo '/.gpu_all.tar.xz' >> .git/info/exclude
    tar cf - .gpu | xz -T2 -6 --lzma2=dict=256MiB > .gpu_all.tar.xz.tmp
    mv .gpu_all.tar.xz.tmp .gpu_all.tar.xz
    ls -l .gpu_all.tar.xz
    ;;
  run)
    out=${OUT:-/tmp/out}
    mkdir -p "$out/logs"
    [[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
    # Each binary a test starts goes where Bazel's runfiles would hold it, beside its sources (this
    # working tree is the device's copy); the tests run from the root, where their data files are.
    (cd .gpu/bin && find . -type f) | sed 's|^\./||' | grep -vxF -f .gpu/tests | while read -r b; do
      cp .gpu/bin/"$b" "$b"
    done
    echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(wc -l < .gpu/tests) tests"
    one() {
      local t=$1 log s0 rc
      log=$(mktemp)
      s0=$(date +%s)
      timeout 300 .gpu/run "$t" > "$log" 2>&1
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
    ;;
  *)
    sed -n 2,11p "$0"
    exit 2
    ;;
esac
