#!/bin/bash
# train_tokenizer as a process: a malformed VOCAB_SIZE, missing arguments (exit 2) and an unknown
# flag (Abseil: exit 1) are rejected with messages that name them.
set -u
bin="$1"
fail=0
expect() {  # expect EXIT_CODE TEXT ARGS...: the run exits with EXIT_CODE and prints TEXT.
  local code="$1" text="$2" out rc
  shift 2
  out="$(timeout 60 "$bin" "$@" 2>&1)"
  rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* exited $rc (expected $code), output should contain: $text"
    echo "$out"
    fail=1
  fi
}
out="${TEST_TMPDIR:-/tmp}/tok"
expect 2 "VOCAB_SIZE: expected a positive integer, found '2k'" "$out" 2k
expect 2 "VOCAB_SIZE: expected a positive integer, found '0'" "$out" 0
expect 2 "usage: train_tokenizer OUT_DIR VOCAB_SIZE" "$out"
expect 1 "Unknown command line flag 'vocab'" --vocab=256 "$out" 256
exit $fail
