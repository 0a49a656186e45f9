#!/usr/bin/env bash
# One GPU call (1 H200), 2026-11-30 session 9, fifth call: the embedding backward "atomic2s" (the
# zero fill of rows without tokens on the caller's stream, overlapped with the index preparation and
# the other rows' sums on a high-priority side stream) against "atomic", every embedding test; then
# the 1b step at the default 32 GiB budget and its peer, on the same GPU.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test
#   //kernels/embedding:embedding_benchmark //benchmarks:llama_step_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding_test 150 kernels/embedding/embedding_test
bm() {  # name filter [env...]
  local name=$1 filter=$2; shift 2
  env "$@" timeout 150 .gpu/run kernels/embedding/embedding_benchmark --benchmark_filter="$filter" > "$logs/$name.log" 2>&1
  echo "$name (rc=$?):"; grep -E '^BM_' "$logs/$name.log" | awk '{l=$1; for(i=2;i<=NF;i++) if($i ~ /TBps/) l=l" "$i; print "  " l}'
}
bm emb 'Backward.*(Atomic|Atomic2s|ZeroFill)Batch/16384/(32000|128256)/(8|2048)/'
bm emb_hot 'Backward.*(Atomic|Atomic2s)HotBatch/16384/'
bm emb_again 'Backward.*(Atomic|Atomic2s)Batch/16384/32000/2048/'
for i in a b; do
  timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=20 --warmup=5 > "$logs/ours_$i.log" 2>&1
  echo "ours 1b default ($i): $(json "$logs/ours_$i.log")"
done
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
