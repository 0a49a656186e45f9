#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 7, second call: the 1b step with the warp-specialized
# attention forward as the default, ours under three recompute policies and the torch.compile peer
# on the same GPU (GPU 0: ours selective, peer, ours none, ours auto; GPU 1: peer, ours selective,
# the single-GPU step tests, one traced step), then the 2-GPU step tests.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch \
#   //compiler:llama_step_test //compiler:compile_test //compiler:f16_mixed_precision_test \
#   //compiler:distributed_test //compiler:dist_cuda_graph_test //compiler/context_parallel:cp_step_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
steps=${STEPS:-20}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute") if k in j))'; }
ours() {  # gpu recompute [extra args]
  local g=$1 r=$2; shift 2
  CUDA_VISIBLE_DEVICES=$g timeout 150 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute="$r" \
    --steps="$steps" --warmup=5 "$@" > "$logs/ours_g${g}_$r.log" 2>&1
  echo "ours gpu$g $r: $(json "$logs/ours_g${g}_$r.log") $(grep -E 'rror' "$logs/ours_g${g}_$r.log" | tail -1 | cut -c1-160)"
}
peer() {
  CUDA_VISIBLE_DEVICES=$1 timeout 200 python3 benchmarks/llama_peer.py --config 1b --compile --steps "$steps" \
    > "$logs/peer_g$1.log" 2>&1
  echo "peer gpu$1: $(json "$logs/peer_g$1.log") $(grep -E 'Error' "$logs/peer_g$1.log" | tail -1)"
}
t() {  # name seconds binary args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$logs/$name.log" | head -4
}
(ours 0 selective; peer 0; ours 0 none; ours 0 auto) > "$logs/gpu0.txt" 2>&1 &
(peer 1; ours 1 selective
 export CUDA_VISIBLE_DEVICES=1
 t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 t compile_test 120 compiler/compile_test --gtest_filter='*Cuda*'
 t f16_mixed 120 compiler/f16_mixed_precision_test --gtest_filter='*Cuda*:*Gpu*'
 timeout 90 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute=selective --steps=10 --warmup=3 \
   --trace="$logs/trace_1b.json" > "$logs/traced.log" 2>&1
 echo "traced (rc=$?): $(json "$logs/traced.log")") > "$logs/gpu1.txt" 2>&1 &
wait
cat "$logs/gpu0.txt" "$logs/gpu1.txt"
t distributed_gpu 150 compiler/distributed_test --gtest_filter='DistributedTest.FsdpOnTwoGpusEqualsOneGpu'
t dist_cuda_graph 150 compiler/dist_cuda_graph_test
t cp_step_gpu 120 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
python3 - "$logs/trace_1b.json" <<'PY' 2>&1 | head -30
import json,sys,collections,re
t=json.load(open(sys.argv[1])); ev=t['traceEvents'] if isinstance(t,dict) else t
d=collections.defaultdict(float); n=collections.Counter(); tot=0
for e in ev:
    if e.get('ph')!='X': continue
    k=e['name'].split(' @')[0]; m=re.search(r'@layers\.\d+\.(\S+)',e['name'])
    if k=='matmul' and m: k='matmul '+m.group(1).split('.')[-1]
    elif k=='matmul': k='matmul '+e['name'].split('@')[-1]
    d[k]+=e.get('dur',0); n[k]+=1; tot+=e.get('dur',0)
print(f"trace total {tot/1000:.1f} ms")
for k,v in sorted(d.items(),key=lambda x:-x[1])[:24]: print(f"{v/1000:8.2f} ms {n[k]:4d} {k}")
PY
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
