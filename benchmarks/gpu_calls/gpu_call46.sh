#!/usr/bin/env bash
# Run 2026-12-01 (results in benchmarks/README.md; the knobs it measured are removed). Prepared then (1 H200, ~3 minutes): issue #3's embedding backward with
# SG_EMBEDDING_SINGLES=1 (kernels/embedding/embedding_atomic.cu): the rows of one token (77% of the
# touched rows at 16384 of 32000) copied in token order by SinglesKernel on the side stream right
# after the count, before the scan (phased id -> count -> dout loads, eight items a thread), only
# rows of two tokens or more sorted and summed; the zero fill unchanged. The "singles in the fill" forms lost (23:28-23:44);
# predicted here: 3.6-3.8 TB/s if the side stream's streaming copy runs beside the fill at ~4 TB/s
# combined, a loss like theirs if not. The embedding tests (bitwise, with and without the knob),
# then the knob against the default alternating, plain, hot, 128256 and dim 8. First, the deferred
# optimizer's CUDA path on one GPU (FSDP over a group of one against the single-device step), in
# case no 2-GPU machine is lent for gpu_call48.sh.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
#         //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t distributed_one_gpu 150 compiler/distributed_test --gtest_filter='*OneGpu*'
t embedding 150 kernels/embedding/embedding_test
export BM_TIMEOUT=100
for r in 1 2; do
  bm "singles_$r" 'Backward.*(Atomic2s|Atomic2sSingles)Batch/16384/32000/2048/'
done
bm large 'Backward.*(Atomic2s|Atomic2sSingles)Batch/16384/(128256/2048|32000/8)/'
bm hot 'Backward.*(Atomic2sHot|Atomic2sSinglesHot)Batch/16384/32000/2048/'
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
