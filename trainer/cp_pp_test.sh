#!/usr/bin/env bash
# The main job with --strategy=cp (2 ranks: the sequence split, ring attention) and --strategy=pp
# (2 stages, 4 micro-batches; and 2 replicas x 2 stages on 4 ranks, batch 2 each, replicated and
# with each stage sharded over its replicas: --pp_fsdp) through
# //comm:launch against 1 rank on the same batches: every step's loss must agree (issue 11: the
# trainer runs context and pipeline parallel).
set -euo pipefail
llama=$(realpath "$1") launch=$(realpath "$2")
work=${TEST_TMPDIR:-$(mktemp -d)}
cd "$work"
common=(--steps=4 --device=cpu --eval_batches=1 --seed=7 --seq=60)
"$llama" "${common[@]}" --batch=4 --name=one > one.log 2>&1 || { cat one.log; exit 1; }
"$launch" --nproc=2 -- "$llama" "${common[@]}" --batch=4 --strategy=cp --name=cp > cp.log 2>&1 \
  || { cat cp.log; exit 1; }
"$launch" --nproc=2 -- "$llama" "${common[@]}" --batch=4 --strategy=pp --micro_batches=4 --name=pp > pp.log 2>&1 \
  || { cat pp.log; exit 1; }
"$launch" --nproc=4 -- "$llama" "${common[@]}" --batch=2 --strategy=pp --mesh=2x2 --name=dppp > dppp.log 2>&1 \
  || { cat dppp.log; exit 1; }
"$launch" --nproc=4 -- "$llama" "${common[@]}" --batch=2 --strategy=pp --mesh=2x2 --pp_fsdp --name=ppfsdp \
  > ppfsdp.log 2>&1 || { cat ppfsdp.log; exit 1; }
python3 - runs/one/metrics.jsonl runs/cp/metrics.jsonl runs/pp/metrics.jsonl runs/dppp/metrics.jsonl \
  runs/ppfsdp/metrics.jsonl <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, filter(str.strip, open(path))) if "loss" in r]
one, cp, pp, dppp, ppfsdp = (losses(p) for p in sys.argv[1:6])
assert all(len(x) == 4 for x in (one, cp, pp, dppp, ppfsdp)), f"expected 4 steps each: {one}, {cp}, {pp}, {dppp}, {ppfsdp}"
for a, b, c, d, e in zip(one, cp, pp, dppp, ppfsdp):
    print(f"1 rank {a:.6f}   cp=2 {b:.6f}   pp=2 {c:.6f}   dp=2 x pp=2 {d:.6f}   fsdp=2 x pp=2 {e:.6f}")
assert one[-1] < one[0], f"the loss did not fall: {one}"
for name, other in (("cp", cp), ("pp", pp), ("dp x pp", dppp), ("fsdp x pp", ppfsdp)):
    worst = max(abs(a - b) / abs(a) for a, b in zip(one, other))
    assert worst < 1e-4, f"1-rank and {name} losses differ by {worst:.2e} (relative), tolerance 1e-4"
    print(f"{name}: max relative difference {worst:.2e}")
PY
