#!/usr/bin/env bash
# The main job with tensor parallelism through //comm:launch against 1 rank on the same global
# batch (8 sequences): 2 tp ranks (each sees the whole batch), and a 2x2 mesh (dp x tp: each dp
# pair sees half). Every step's loss and gradient norm must agree. The tiny preset has 1 KV head,
# so the model comes from a config.json with 2 query and 2 key/value heads (both split over tp=2).
set -euo pipefail
llama=$(realpath "$1") launch=$(realpath "$2")
work=${TEST_TMPDIR:-$(mktemp -d)}
cd "$work"
cat > config.json <<'JSON'
{"model_type": "llama", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
 "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 258, "max_position_embeddings": 128,
 "rms_norm_eps": 1e-5, "bos_token_id": 256, "eos_token_id": 257}
JSON
common=(--steps=6 --device=cpu --eval_batches=1 --seed=7 --hf_config=config.json --seq=64 --lr=3e-3 --warmup=1)
"$llama" "${common[@]}" --batch=8 --name=one > one.log 2>&1 || { cat one.log; exit 1; }
"$launch" --nproc=2 -- "$llama" "${common[@]}" --batch=8 --strategy=tp --name=tp > tp.log 2>&1 \
  || { cat tp.log; exit 1; }
"$launch" --nproc=4 -- "$llama" "${common[@]}" --batch=4 --strategy=tp --mesh=2x2 --name=dptp > dptp.log 2>&1 \
  || { cat dptp.log; exit 1; }
python3 - runs/one/metrics.jsonl runs/tp/metrics.jsonl runs/dptp/metrics.jsonl <<'PY'
import json, sys
def steps(path):
    return [r for r in map(json.loads, filter(str.strip, open(path))) if "loss" in r]
one = steps(sys.argv[1])
assert len(one) == 6, f"expected 6 steps, found {len(one)}"
assert one[-1]["loss"] < one[0]["loss"] - 0.1, f"the loss did not fall: {[r['loss'] for r in one]}"
for label, path in (("tp=2", sys.argv[2]), ("dp=2 x tp=2", sys.argv[3])):
    other = steps(path)
    assert len(other) == 6, f"{label}: expected 6 steps, found {len(other)}"
    worst = 0.0
    for a, b in zip(one, other):
        print(f"1 rank loss {a['loss']:.6f} norm {a['grad_norm']:.6f}   {label} loss {b['loss']:.6f} norm {b['grad_norm']:.6f}")
        worst = max(worst, abs(a["loss"] - b["loss"]) / abs(a["loss"]),
                    abs(a["grad_norm"] - b["grad_norm"]) / abs(a["grad_norm"]))
    assert worst < 1e-4, f"{label}: differs from 1 rank by {worst:.2e} (relative), tolerance 1e-4"
    print(f"{label}: max relative difference {worst:.2e}")
PY
