#!/bin/bash
# The llama binary as a process: a bad value and an unknown flag are rejected naming the flag, and
# the process exits (these used to hang in exit() while libsentencepiece.so's FLAGS_help clashed
# with Abseil's; see third_party/system/sentencepiece.BUILD).
set -u
source "$1"  # tools/expect_exit.sh: expect CODE TEXT ARGS...
bin="$2"
expect_timeout=30
expect 1 "Illegal value 'ten' specified for flag 'steps'" --steps=ten
expect 1 "Unknown command line flag 'step'" --step=10
expect 2 "unexpected argument 'tiny'" tiny
expect 0 "--sp_vocab (default '2048')" --help
expect 1 "--recompute: expected auto, none, selective or full, found 'partial'" --recompute=partial --steps=1
expect 1 "--memory_budget_gib: expected >= 0, found -2" --memory_budget_gib=-2 --steps=1
expect 1 "--gradients: expected auto, f32 or bf16, found 'f16'" --gradients=f16 --steps=1
expect 1 "--gradients=bf16: expected --precision=bf16 with --strategy=none, fsdp or hybrid and --grad_accum=1, found --precision=f32" --gradients=bf16 --precision=f32 --steps=1
exit $fail
