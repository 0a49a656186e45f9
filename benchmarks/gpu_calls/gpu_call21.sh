#!/usr/bin/env bash
# One GPU call (1 H200), 2026-11-30 session 8, third call: the embedding backward with its index
# prepared by one CTA (atomic, the new default up to vocab 51199) against the four-launch chain
# (atomic_chain), its tests (every variant bitwise against rows and the CPU), and the 1b step under
# the 32.8 GiB default budget (0.8x the peer's 41.02) with the peer on the same GPU.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
#   //benchmarks:llama_step_benchmark //compiler:llama_step_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","planned_arena_gib","mfu","loss_first","loss_last","recompute","recompute_swiglu_layers") if k in j))'; }
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -6; }
t embedding_test 120 kernels/embedding/embedding_test
timeout 150 .gpu/run kernels/embedding/embedding_benchmark \
  --benchmark_filter='Backward.*(Atomic|AtomicChain|AtomicHot|AtomicChainHot|ZeroFill)Batch/16384/(32000|128256)/(8|2048)' > "$logs/bm_emb.log" 2>&1
echo "embedding (rc=$?):"; grep -E '^BM_' "$logs/bm_emb.log" | awk '{for(i=1;i<=NF;i++) if($i ~ /bytes_per_second/) t=$i; print "  " $1, $2, $3, t}'
ours() { timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute="$2" --steps=20 --warmup=5 > "$logs/ours_$1.log" 2>&1
  echo "ours 1b $2 ($1): $(json "$logs/ours_$1.log") $(grep -E 'rror' "$logs/ours_$1.log" | tail -1 | cut -c1-160)"; }
ours a auto
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours b auto
SG_EMBEDDING_BWD=atomic_chain ours c auto
t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
