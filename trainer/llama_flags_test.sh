#!/bin/bash
# The llama binary as a process: a bad value and an unknown flag are rejected naming the flag, and
# the process exits (these used to hang in exit() while libsentencepiece.so's FLAGS_help clashed
# with Abseil's; see third_party/system/sentencepiece.BUILD).
set -u
bin="$1"
fail=0
expect() {  # expect EXIT_CODE TEXT ARGS...: the run exits with EXIT_CODE and prints TEXT.
  local code="$1" text="$2" out rc
  shift 2
  out="$(timeout 30 "$bin" "$@" 2>&1)"
  rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* exited $rc (expected $code), output should contain: $text"
    echo "$out"
    fail=1
  fi
}
expect 1 "Illegal value 'ten' specified for flag 'steps'" --steps=ten
expect 1 "Unknown command line flag 'step'" --step=10
expect 2 "unexpected argument 'tiny'" tiny
expect 0 "--sp_vocab (default '2048')" --help
exit $fail
