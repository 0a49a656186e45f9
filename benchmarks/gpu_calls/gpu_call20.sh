#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 8, second call: our Hopper GEMM for the step's forward
# GEMMs (SG_GEMM_WGMMA=1) against cuBLASLt, alternating on GPU 0 with the peer after; on GPU 1 the
# GEMM and step tests with it on, BM_Gemm at every forward shape of the 1b step, the embedding
# backward's index preparation alone (dim 8) next to the full shapes, and one traced step each way.
# Then the 2-GPU step tests (the comparisons now clip at kMaxGradNorm 0.25).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //kernels/gemm_rmsnorm:gemm_rmsnorm_benchmark
#   //kernels/gemm:gemm_test //compiler:llama_step_test //kernels/embedding:embedding_benchmark //comm:launch
#   //compiler:{distributed,dist_cuda_graph,micro_batch,tensor_parallel}_test
#   //compiler/context_parallel:cp_step_test //compiler/pipeline:pp_step_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute") if k in j))'; }
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -4; }
single() {  # tag wgmma
  CUDA_VISIBLE_DEVICES=0 SG_GEMM_WGMMA=$2 timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute=auto \
    --steps=20 --warmup=5 > "$logs/single_$1.log" 2>&1
  echo "ours 1b gpu0 auto wgmma=$2 ($1): $(json "$logs/single_$1.log") $(grep -E 'rror' "$logs/single_$1.log" | tail -1 | cut -c1-160)"; }
(single a0 0; single a1 1; single b0 0; single b1 1
 CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
 echo "peer 1b gpu0: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)") > "$logs/gpu0.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=1
 SG_GEMM_WGMMA=1 t gemm_wgmma 120 kernels/gemm/gemm_test
 SG_GEMM_WGMMA=1 t llama_step_wgmma 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 timeout 150 .gpu/run kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark --benchmark_filter='BM_Gemm/M:16384/.*impl:[046]' \
   > "$logs/bm_gemm.log" 2>&1
 echo "BM_Gemm (rc=$?):"; grep -E '^BM_Gemm' "$logs/bm_gemm.log" | awk '{for(i=1;i<=NF;i++) if($i ~ /TFLOP/) t=$i; print "  " $1, t}'
 timeout 90 .gpu/run kernels/embedding/embedding_benchmark \
   --benchmark_filter='Backward.*(Atomic|Scan3|ZeroFill)Batch/16384/(32000|128256)/(8|2048)' > "$logs/bm_emb.log" 2>&1
 echo "embedding (rc=$?):"; grep -E '^BM_' "$logs/bm_emb.log" | awk '{for(i=1;i<=NF;i++) if($i ~ /bytes_per_second/) t=$i; print "  " $1, $2, $3, t}'
 for w in 0 1; do
   SG_GEMM_WGMMA=$w timeout 90 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute=auto --steps=8 --warmup=3 \
     --trace="$logs/trace_$w.json" > "$logs/traced_$w.log" 2>&1
   echo "traced wgmma=$w (rc=$?): $(json "$logs/traced_$w.log")"
 done) > "$logs/gpu1.txt" 2>&1 &
wait
cat "$logs/gpu0.txt" "$logs/gpu1.txt"
for w in 0 1; do
python3 - "$logs/trace_$w.json" $w <<'PY' 2>&1 | head -16
import json,sys,collections,re
t=json.load(open(sys.argv[1])); ev=t['traceEvents'] if isinstance(t,dict) else t
d=collections.defaultdict(float); n=collections.Counter(); tot=0
for e in ev:
    if e.get('ph')!='X': continue
    k=e['name'].split(' @')[0]; m=re.search(r'@layers\.\d+\.(\S+)',e['name'])
    if k=='matmul' and m: k='matmul '+m.group(1).split('.')[-1]
    elif k=='matmul': k='matmul '+e['name'].split('@')[-1]
    d[k]+=e.get('dur',0); n[k]+=1; tot+=e.get('dur',0)
print(f"trace wgmma={sys.argv[2]} total {tot/1000:.1f} ms")
for k,v in sorted(d.items(),key=lambda x:-x[1])[:14]: print(f"{v/1000:8.2f} ms {n[k]:4d} {k}")
PY
done
t distributed_gpu 120 compiler/distributed_test --gtest_filter='*TwoGpus*'
t dist_cuda_graph 90 compiler/dist_cuda_graph_test
t micro_batch_gpu 60 compiler/micro_batch_test --gtest_filter='*Gpu*'
t cp_step_gpu 60 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
t tensor_parallel_gpu 60 compiler/tensor_parallel_test --gtest_filter='*Gpu*'
t pp_step_gpu 60 compiler/pipeline/pp_step_test --gtest_filter='*Gpu*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
