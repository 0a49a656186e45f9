#!/usr/bin/env bash
# One GPU-machine call (2 H200s) for the training step end to end:
#  A. the single-GPU Llama step on GPU 0 (per config in CONFIGS; 1b also with --recompute=none) while
#     the torch.compile peer runs the same configs on GPU 1;
#  B. FSDP over both GPUs: ours (llama_step_benchmark --strategy=fsdp under comm/launch), then the
#     FSDP2 peer under torchrun;
#  C. the 2-GPU compiler tests (CUDA step vs CPU step, FSDP / micro-batches / context and pipeline
#     parallel on two GPUs vs one) and the CP / PP benchmarks.
# Every log goes into $OUT/logs.tgz (with a Chrome trace of one 1b step); a short table is printed.
# Build first (here), then carry .gpu (or an archive of it, unpacked first):
#   ../shared/tools/gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch \
#     //trainer:llama //compiler:llama_step_test //compiler:distributed_test //compiler:micro_batch_test \
#     //compiler/context_parallel:cp_step_test //compiler/pipeline:pp_step_test \
#     //compiler/context_parallel:cp_benchmark //compiler/pipeline:pp_benchmark \
#     //compiler:tensor_parallel_test //kernels/rmsnorm:rmsnorm_test //kernels/add_rmsnorm:add_rmsnorm_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd)
steps=${STEPS:-20}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","exposed_comm_share","loss_first","loss_last","recompute","recompute_swiglu_layers","world") if k in j))'; }
t() {  # name seconds binary args...: a test binary, one summary line
  local name=$1 limit=$2; shift 2
  [[ -x .gpu/bin/$1 ]] || return
  timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$logs/$name.log" | head -4
}

# A. GPU 1: the peers; GPU 0: ours.
(for cfg in ${CONFIGS:-1b 124m}; do
   CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/llama_peer.py --config "$cfg" --compile --steps "$steps" \
     > "$logs/peer_$cfg.log" 2>&1
 done) &
for run in ${RUNS:-1b:auto 1b:none 124m:auto}; do
  cfg=${run%%:*}; rc=${run##*:}
  extra=()
  [[ $run == 1b:auto ]] && extra=(--trace="$logs/trace_1b.json")
  CUDA_VISIBLE_DEVICES=0 timeout 120 .gpu/run benchmarks/llama_step_benchmark --config="$cfg" --recompute="$rc" \
    --steps="$steps" --warmup=5 "${extra[@]}" > "$logs/ours_${cfg}_$rc.log" 2>&1
  echo "ours $cfg $rc: $(json "$logs/ours_${cfg}_$rc.log") $(grep -E 'rror|step [0-9.]+ ms' "$logs/ours_${cfg}_$rc.log" | tail -2)"
done
wait
for cfg in ${CONFIGS:-1b 124m}; do echo "peer $cfg: $(json "$logs/peer_$cfg.log") $(grep -E 'Error' "$logs/peer_$cfg.log" | tail -1)"; done

# B. FSDP on both GPUs.
# FSDP_RUNS: "config:recompute:budget_gib:graph[:ipc] ..." (graph 0 = eager steps, SG_CUDA_GRAPH=0;
# ipc 0 = device collectives over the NCCL ring, SG_COMM_IPC=0; default 1, CUDA IPC); the
# peer (FSDP2 + compile, with activation checkpointing for 7b) runs once per config.
if [[ -z ${SKIP_FSDP:-} ]]; then
  for run in ${FSDP_RUNS:-1b:auto:25:1}; do
    IFS=: read -r cfg rc budget graph ipc <<< "$run"
    SG_COMM_IPC=${ipc:-1} SG_CUDA_GRAPH=$graph timeout 200 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
      --config="$cfg" --strategy=fsdp --recompute="$rc" --memory_budget_gib="$budget" --steps="$steps" --warmup=5 \
      > "$logs/ours_${cfg}_fsdp_${rc}_${budget}_${graph}_${ipc:-1}.log" 2>&1
    echo "ours $cfg fsdp x2 $rc budget $budget graph $graph ipc ${ipc:-1}: $(json "$logs/ours_${cfg}_fsdp_${rc}_${budget}_${graph}_${ipc:-1}.log") $(grep -E 'rror|CUDA graph|eager \(' "$logs/ours_${cfg}_fsdp_${rc}_${budget}_${graph}_${ipc:-1}.log" | head -2 | cut -c1-200)"
  done
  for cfg in ${FSDP_PEERS:-1b}; do
    ac=(); [[ $cfg == 7b ]] && ac=(--ac)
    timeout 240 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config "$cfg" --compile --fsdp "${ac[@]}" \
      --steps "$steps" > "$logs/peer_${cfg}_fsdp.log" 2>&1
    echo "peer $cfg fsdp x2: $(json "$logs/peer_${cfg}_fsdp.log") $(grep -E 'Error' "$logs/peer_${cfg}_fsdp.log" | tail -1)"
  done
fi

# C. Tests and the CP / PP benchmarks.
if [[ -z ${SKIP_TESTS:-} ]]; then
  t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
  t distributed_gpu 120 compiler/distributed_test --gtest_filter='DistributedTest.FsdpOnTwoGpusEqualsOneGpu'
  t micro_batch_gpu 120 compiler/micro_batch_test --gtest_filter='*Gpu*'
  t cp_step_gpu 120 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
  t pp_step_gpu 120 compiler/pipeline/pp_step_test --gtest_filter='*Gpu*'
  t tensor_parallel_gpu 120 compiler/tensor_parallel_test --gtest_filter='*Gpu*'
  t rmsnorm_test 60 kernels/rmsnorm/rmsnorm_test
  t add_rmsnorm_test 60 kernels/add_rmsnorm/add_rmsnorm_test
fi
if [[ -z ${SKIP_TRAINER:-} && -x .gpu/bin/trainer/llama ]]; then  # the main job: FSDP over both GPUs, briefly
  (cd "$logs" && timeout 120 "$here/.gpu/run" comm/launch --nproc=2 -- "$here/.gpu/bin/trainer/llama" --device=cuda \
     --strategy=fsdp --steps=200 --name=gpu_fsdp > trainer_fsdp.log 2>&1; echo "trainer fsdp x2 rc=$?")
  grep -E 'step +200|val|loss' "$logs/trainer_fsdp.log" | tail -4 | cut -c1-200
fi
if [[ -z ${SKIP_CPPP:-} ]]; then
  timeout 150 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/compiler/context_parallel/cp_benchmark" \
    --benchmark_counters_tabular=true > "$logs/cp_bench.log" 2>&1; echo "cp bench rc=$?"
  grep -E 'rank 0\].*BM_' "$logs/cp_bench.log" | cut -c1-200 | head -12
  timeout 120 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/compiler/pipeline/pp_benchmark" \
    --benchmark_counters_tabular=true > "$logs/pp_bench.log" 2>&1; echo "pp bench rc=$?"
  grep -E 'rank 0\].*BM_' "$logs/pp_bench.log" | cut -c1-200 | head -8
fi
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
