#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 9, fourth call. Why does the 1b FSDP step gain nothing
# from its CUDA graph (traced eager 214.2 ms, graph 214.6) while the single-GPU step gains ~8 ms
# (205.7 -> 197)? Eager vs graph for both, FSDP2's step in the same call, and (when the machine has
# Nsight Systems) a kernel-level profile of replayed FSDP steps: per-stream kernel and copy times.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-12}
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${nsys:-none}; ncu: $(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
fsdp() {  # tag [flags...]
  local tag=$1; shift
  SG_COMM_IPC=1 timeout 150 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps="$steps" --warmup=4 "$@" > "$logs/fsdp_$tag.log" 2>&1
  echo "fsdp 1b 25 $tag: $(json "$logs/fsdp_$tag.log") $(grep -E 'rror' "$logs/fsdp_$tag.log" | head -1 | cut -c1-200)"
}
fsdp graph
fsdp eager --cuda_graph=false
(export CUDA_VISIBLE_DEVICES=0
 for g in true false; do
   timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=12 --warmup=4 --cuda_graph=$g > "$logs/single_$g.log" 2>&1
   echo "single 1b auto cuda_graph=$g: $(json "$logs/single_$g.log")"
 done)
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps "$steps" \
  > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error' "$logs/peer_1b_fsdp.log" | tail -1)"
if [ -n "$nsys" ]; then
  SG_COMM_IPC=1 timeout 200 "$nsys" profile -t cuda --cuda-graph-trace=node -o "$logs/fsdp" --force-overwrite true \
    .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps=4 --warmup=4 > "$logs/nsys_run.log" 2>&1
  echo "nsys profile rc=$? $(ls -la "$logs"/fsdp.* 2>/dev/null | awk '{print $5, $9}' | tr '\n' ' ')"
  timeout 200 "$nsys" stats -r cuda_gpu_trace -f csv -o "$logs/fsdp" "$logs/fsdp.nsys-rep" > "$logs/nsys_stats.log" 2>&1
  echo "nsys stats rc=$? $(ls "$logs" | grep -i csv | tr '\n' ' ')"
  rm -f "$logs"/fsdp.nsys-rep "$logs"/fsdp.sqlite
  for f in "$logs"/*.csv; do [ -f "$f" ] && xz -T4 "$f"; done
fi
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
