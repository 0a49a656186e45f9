#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 7, sixth call: (1) DistributedTest.FsdpOnTwoGpusEqualsOneGpu
# with the seed that failed in the fifth call (tok_embeddings 2.46% after 3 steps, tolerance 2%), on
# the binary from before the FSDP memory changes and on the current one; (2) our GEMM with the
# inline trap restored against the pre-sm90.h binary, alternating; (3) the wgmma / embedding tests.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
cp .gpu-old/gemm_rmsnorm_benchmark .gpu/bin/kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark_old
cp .gpu-old/distributed_test_old .gpu/bin/compiler/distributed_test_old
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"
  grep -E 'tok_embeddings.weight relative error .* after' "$logs/$name.log" | sort -u | head -2; }
echo "== $(date -u +%FT%TZ)"
for b in distributed_test_old distributed_test; do
  SG_TEST_SEED=9945489772930281095 t "$b" 120 compiler/$b --gtest_filter='DistributedTest.FsdpOnTwoGpusEqualsOneGpu'
done
(export CUDA_VISIBLE_DEVICES=1
 t wgmma_gemm_test 100 kernels/wgmma_gemm/wgmma_gemm_test
 t wgmma_swiglu_test 100 kernels/wgmma_gemm/wgmma_gemm_swiglu_test
 t gemm_rmsnorm_test 100 kernels/gemm_rmsnorm/gemm_rmsnorm_test
 t embedding_test 120 kernels/embedding/embedding_test) > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 for b in gemm_rmsnorm_benchmark_old gemm_rmsnorm_benchmark gemm_rmsnorm_benchmark_old gemm_rmsnorm_benchmark; do
   timeout 40 .gpu/run kernels/gemm_rmsnorm/$b --benchmark_min_time=0.2 \
     --benchmark_filter='BM_Gemm/M:16384/N:(3072|8192)/K:2048/impl:[04]/' > "$logs/$b.log" 2>&1
   echo "$b: $(grep -E '^BM_' "$logs/$b.log" | sed -E 's/.*N:([0-9]+).*impl:([0-9]).*TFLOP\/s=([0-9.]+).*/N\1 impl\2 \3/' | tr '\n' ' ')"
 done
 timeout 40 .gpu/run kernels/embedding/embedding_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter='Backward.*(Atomic|Scan3)Batch/16384/(32000|128256)/2048' > "$logs/emb.log" 2>&1
 grep -E '^BM_' "$logs/emb.log" | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*/\1 mean \2 TB\/s/' | sed 's/\/manual_time//') > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
