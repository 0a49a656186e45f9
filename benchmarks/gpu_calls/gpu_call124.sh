#!/usr/bin/env bash
# One H200, ~8 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# 1. Every cc_test on the GPU at main after the GEMM tuner's AlgoBytes / AlgoFits cleanup (1d1a417).
# (Run 2026-12-04 20:18: the full pack lacks attention_benchmark, which no test starts, so the two
# attention profiles and the SASS dump failed with rc 127 / 1; gpu_call125.sh ran them from its own bundle.)
# 2. Where the attention's joules go: the 1b's attention runs at ~2 J a TFLOP against the GEMMs'
#    ~1 (the energy profile), so Nsight Compute's pipe utilization and executed-instruction mix of
#    our D64 causal forward (WsFwdKernel) and backward (AttentionBackwardV5Kernel) at the 1b's shape,
#    beside one of cuBLAS's GEMMs at the MLP's forward shape (torch.mm): how much of the work is
#    tensor-core work, and how much is FP32, MUFU (exp2) and shared-memory traffic. Clocks left
#    alone (--clock-control none).
# 3. The 1b against the peer, O P O, 30 steps each: that the cleanup changed nothing.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
benchmarks/gpu_tests.sh run 2>&1 | grep -v '^PASS' | tail -20
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis"
prof() {  # prof NAME KERNEL-REGEX COMMAND...
  local name=$1 k=$2
  shift 2
  timeout 180 ncu --clock-control none --target-processes all -k "regex:$k" --launch-skip 3 --launch-count 1 \
    $sections --print-details all "$@" > "$logs/ncu_$name.txt" 2>&1
  echo "ncu $name rc=$?"
  grep -E 'Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|Issue Slots Busy|DRAM Throughput' \
    "$logs/ncu_$name.txt" | head -12
}
filt='BM_AttentionCudaDefault/%s/D:64/causal:1/f16:0'
prof bwd AttentionBackwardV5Kernel .gpu/run kernels/attention/attention_benchmark \
  --benchmark_filter="$(printf "$filt" backward)"
prof fwd WsFwdKernel .gpu/run kernels/attention/attention_benchmark --benchmark_filter="$(printf "$filt" forward)"
prof gemm 'gemm|nvjet|sm90' python3 -c "
import torch
x = torch.randn(16384, 2048, device='cuda', dtype=torch.bfloat16)
w = (torch.randn(8192, 2048, device='cuda') * 0.02).to(torch.bfloat16)
for _ in range(8): y = x @ w.t()
torch.cuda.synchronize()"
cuobjdump -sass .gpu/bin/kernels/attention/attention_benchmark > "$logs/attention_sass.txt" 2>&1
echo "sass rc=$? $(wc -l < "$logs/attention_sass.txt") lines"
ours_1b a --steps=30
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b b --steps=30
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
