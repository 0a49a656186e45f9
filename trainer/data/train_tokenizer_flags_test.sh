#!/bin/bash
# train_tokenizer as a process: a malformed VOCAB_SIZE, missing arguments (exit 2) and an unknown
# flag (Abseil: exit 1) are rejected with messages that name them.
set -u
source "$1"  # tools/expect_exit.sh: expect CODE TEXT ARGS...
bin="$2"
out="${TEST_TMPDIR:-/tmp}/tok"
expect 2 "VOCAB_SIZE: expected a positive integer, found '2k'" "$out" 2k
expect 2 "VOCAB_SIZE: expected a positive integer, found '0'" "$out" 0
expect 2 "usage: train_tokenizer OUT_DIR VOCAB_SIZE" "$out"
expect 1 "Unknown command line flag 'vocab'" --vocab=256 "$out" 256
exit $fail
