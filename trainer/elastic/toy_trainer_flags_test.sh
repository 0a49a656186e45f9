#!/bin/bash
# toy_trainer as a process: bad values and unknown flags are usage errors that name the flag
# (Abseil's type errors exit 1, the trainer's own checks exit 2). Nothing here reaches the rendezvous.
set -u
source "$1"  # tools/expect_exit.sh: expect CODE TEXT ARGS...
bin="$2"
expect 1 "Illegal value '3x' specified for flag 'steps'" --ckpt_dir=/tmp/x --steps=3x
expect 1 "Unknown command line flag 'kill'" --ckpt_dir=/tmp/x --kill=1
expect 2 "--ckpt_dir is required" --steps=3
expect 2 "--every and --size: expected >= 1, found 0 and 1000" --ckpt_dir=/tmp/x --every=0
exit $fail
