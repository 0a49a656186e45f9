#!/usr/bin/env bash
# The main job on 2 CPU ranks (FSDP, batch 4 each, through //comm:launch) against 1 rank with
# batch 8: the same global batch, so every step's loss must agree (issue 9's "2-rank CPU run
# matches the 1-rank loss"). Compares metrics.jsonl, written by each run, step by step.
set -euo pipefail
llama=$(realpath "$1") launch=$(realpath "$2")
work=${TEST_TMPDIR:-$(mktemp -d)}
cd "$work"
common=(--steps=6 --device=cpu --eval_batches=1 --seed=7)
"$llama" "${common[@]}" --batch=8 --name=one > one.log 2>&1 || { cat one.log; exit 1; }
"$launch" --nproc=2 -- "$llama" "${common[@]}" --batch=4 --strategy=fsdp --name=two > two.log 2>&1 \
  || { cat two.log; exit 1; }
python3 - runs/one/metrics.jsonl runs/two/metrics.jsonl <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, filter(str.strip, open(path))) if "loss" in r]
one, two = losses(sys.argv[1]), losses(sys.argv[2])
assert len(one) == 6 and len(two) == 6, f"expected 6 steps each, found {len(one)} and {len(two)}"
assert one[-1] < one[0] - 0.1, f"the loss did not fall: {one}"
worst = max(abs(a - b) / abs(a) for a, b in zip(one, two))
for a, b in zip(one, two):
    print(f"1 rank {a:.6f}   2 ranks (FSDP) {b:.6f}")
assert worst < 1e-4, f"1-rank and 2-rank losses differ by {worst:.2e} (relative), tolerance 1e-4"
print(f"max relative difference {worst:.2e}")
PY
