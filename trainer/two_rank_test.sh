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
# AdamW deferred into the next step's forward with 3 units' gradient shards in host memory: the
# learning rate changes every step (warm-up, cosine), and each deferred update must use its own
# step's rate and clip factor; the final checkpoint applies the last pending update.
"$launch" --nproc=2 -- "$llama" "${common[@]}" --batch=4 --strategy=fsdp --fsdp_host_gradient_units=3 \
  --name=deferred > deferred.log 2>&1 || { cat deferred.log; exit 1; }
grep -q "AdamW deferred into the next forward, the gradient shards of 3 units in host memory" deferred.log \
  || { echo "the deferred run does not say it deferred AdamW:"; cat deferred.log; exit 1; }
python3 - runs/one/metrics.jsonl runs/two/metrics.jsonl runs/deferred/metrics.jsonl <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, filter(str.strip, open(path))) if "loss" in r]
one, two, deferred = (losses(p) for p in sys.argv[1:4])
assert len(one) == 6 and len(two) == 6 and len(deferred) == 6, \
    f"expected 6 steps each, found {len(one)}, {len(two)} and {len(deferred)}"
assert one[-1] < one[0] - 0.1, f"the loss did not fall: {one}"
worst = max(abs(a - b) / abs(a) for a, b in zip(one, two))
worst_deferred = max(abs(a - b) / abs(a) for a, b in zip(one, deferred))
for a, b, c in zip(one, two, deferred):
    print(f"1 rank {a:.6f}   2 ranks (FSDP) {b:.6f}   2 ranks, AdamW deferred {c:.6f}")
assert worst < 1e-4, f"1-rank and 2-rank losses differ by {worst:.2e} (relative), tolerance 1e-4"
assert worst_deferred < 1e-4, f"1-rank and deferred 2-rank losses differ by {worst_deferred:.2e}, tolerance 1e-4"
print(f"max relative difference {worst:.2e}, deferred {worst_deferred:.2e}")
PY
# The final checkpoints: the deferred run's weights and AdamW moments (its last update applied when
# the checkpoint reads them) against the eager FSDP run's.
python3 - runs/two runs/deferred <<'PY'
import glob, json, struct, sys
def tensors(run):
    paths = sorted(glob.glob(f"{run}/**/step_*/model.safetensors", recursive=True))
    assert paths, f"no checkpoint under {run}"
    out = {}
    for path in sorted(glob.glob(paths[-1].rsplit("/", 1)[0] + "/*.safetensors")):
        data = open(path, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        for name, t in header.items():
            if name == "__metadata__" or t["dtype"] != "F32":
                continue
            b, e = t["data_offsets"]
            out[name] = struct.unpack(f"<{(e - b) // 4}f", data[8 + n + b:8 + n + e])
    return out, paths[-1]
two, p2 = tensors(sys.argv[1])
deferred, pd = tensors(sys.argv[2])
assert two.keys() == deferred.keys() and len(two) > 0, f"{p2}: {sorted(two)[:4]}..., {pd}: {sorted(deferred)[:4]}..."
worst = 0.0
for name in two:
    a, b = two[name], deferred[name]
    num = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5
    den = sum(x * x for x in a) ** 0.5 or 1.0
    worst = max(worst, num / den)
print(f"{len(two)} tensors of {pd}: largest relative difference to the eager run's {worst:.2e}")
assert worst < 1e-5, f"the deferred run's checkpoint differs from the eager run's by {worst:.2e}"
PY
