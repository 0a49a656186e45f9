#!/usr/bin/env bash
# One GPU-machine call (2 GPUs): the compiled step's GPU tests, then the Llama step benchmark on GPU 0
# with the PyTorch torch.compile peer on GPU 1 at the same time (same machine, same run), per config.
# Build first (here): ../shared/tools/gpu-bundle --flags "-c opt" //compiler:llama_step_test \
#   //compiler:compile_test //compiler:distributed_test \
#   //compiler/context_parallel:ring_attention_device_test //benchmarks:llama_step_benchmark \
#   //compiler:autotune_test //compiler:micro_batch_test
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
t() {  # name timeout binary args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" .gpu/run "$@" > "$out/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$out/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure' "$out/$name.log" | head -5
}
t llama_step_test 150 compiler/llama_step_test --gtest_filter=${LLAMA_TEST_FILTER:-*}
t compile_test_cuda 90 compiler/compile_test --gtest_filter='*Cuda*'
[[ -x .gpu/bin/compiler/distributed_test ]] && t distributed_gpu 120 compiler/distributed_test --gtest_filter='DistributedTest.FsdpOnTwoGpusEqualsOneGpu'
[[ -x .gpu/bin/compiler/context_parallel/ring_attention_device_test ]] && t ring_attention_gpu 120 compiler/context_parallel/ring_attention_device_test
[[ -x .gpu/bin/compiler/autotune_test ]] && t autotune_gpu 120 compiler/autotune_test --gtest_filter='AutotuneCuda.*'
[[ -x .gpu/bin/compiler/micro_batch_test ]] && t micro_batch_gpu 150 compiler/micro_batch_test --gtest_filter='*Gpu*'
for cfg in ${CONFIGS:-124m 1b}; do
  CUDA_VISIBLE_DEVICES=1 timeout 300 python3 benchmarks/llama_peer.py --config "$cfg" --compile \
    > "$out/peer_$cfg.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=0 timeout 300 .gpu/run benchmarks/llama_step_benchmark --config="$cfg" \
    > "$out/ours_$cfg.log" 2>&1
  wait
  echo "ours $cfg: $(grep '^{' "$out/ours_$cfg.log" | tail -1)"; tail -2 "$out/ours_$cfg.log" | grep -v '^{'
  echo "peer $cfg: $(grep '^{' "$out/peer_$cfg.log" | tail -1)"; grep -E 'Error|error' "$out/peer_$cfg.log" | tail -2
done
if [[ -x .gpu/bin/trainer/llama ]]; then  # the main job on the GPU, briefly
  (cd "$out" && timeout 150 "$OLDPWD/.gpu/run" trainer/llama --steps=${TRAIN_STEPS:-300} --device=cuda \
     --name=gpu --time_budget=${TRAIN_SECONDS:-60} > trainer.log 2>&1; echo "trainer rc=$?"; grep -vE '^\s*$' trainer.log | tail -8)
fi
echo "== done $(date -u +%FT%TZ)"
