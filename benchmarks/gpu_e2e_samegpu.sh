#!/usr/bin/env bash
# One GPU call (2 H200s): the single-GPU 1b step, ours and the torch.compile peer on the SAME GPU in
# both orders (GPU 0: ours, peer, ours with SG_ATTENTION_KERNEL=$AB; GPU 1: peer, ours, then the
# single-GPU CUDA tests of the step), then the 2-GPU step tests. A short table is printed; logs go
# into $OUT/logs.tgz.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch \
#   //compiler:llama_step_test //compiler:compile_test //compiler:distributed_test \
#   //compiler:dist_cuda_graph_test //compiler:f16_mixed_precision_test //compiler/context_parallel:cp_step_test
# Env: CONFIG (1b), RECOMPUTE (auto), AB (v4: the comparison attention family; empty to skip), STEPS.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd)
cfg=${CONFIG:-1b}; rc=${RECOMPUTE:-auto}; steps=${STEPS:-20}; ab=${AB-v4}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute","recompute_swiglu_layers") if k in j))'; }
ours() {  # gpu tag attention-family
  CUDA_VISIBLE_DEVICES=$1 SG_ATTENTION_KERNEL=$3 timeout 150 .gpu/run benchmarks/llama_step_benchmark --config="$cfg" \
    --recompute="$rc" --steps="$steps" --warmup=5 > "$logs/ours_$2.log" 2>&1
  echo "ours gpu$1 ${3:-default}: $(json "$logs/ours_$2.log") $(grep -E 'rror' "$logs/ours_$2.log" | tail -1 | cut -c1-160)"
}
peer() {  # gpu tag
  CUDA_VISIBLE_DEVICES=$1 timeout 200 python3 benchmarks/llama_peer.py --config "$cfg" --compile --steps "$steps" \
    > "$logs/peer_$2.log" 2>&1
  echo "peer gpu$1: $(json "$logs/peer_$2.log") $(grep -E 'Error' "$logs/peer_$2.log" | tail -1)"
}
t() {  # name seconds binary args...: a test binary, one summary line
  local name=$1 limit=$2; shift 2
  timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$logs/$name.log" | head -4
}
(ours 0 a ""; peer 0 b; [[ -n $ab ]] && ours 0 c "$ab") > "$logs/gpu0.txt" 2>&1 &
(peer 1 a; ours 1 b ""
 export CUDA_VISIBLE_DEVICES=1
 t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 t compile_test 120 compiler/compile_test --gtest_filter='*Cuda*'
 t f16_mixed 120 compiler/f16_mixed_precision_test --gtest_filter='*Cuda*:*Gpu*') > "$logs/gpu1.txt" 2>&1 &
wait
cat "$logs/gpu0.txt" "$logs/gpu1.txt"
if [[ -z ${SKIP_TWO_GPU:-} ]]; then
  t distributed_gpu 150 compiler/distributed_test --gtest_filter='DistributedTest.FsdpOnTwoGpusEqualsOneGpu'
  t dist_cuda_graph 150 compiler/dist_cuda_graph_test
  t cp_step_gpu 120 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
fi
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
