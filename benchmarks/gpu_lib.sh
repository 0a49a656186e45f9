# Helpers for the one-call GPU scripts (benchmarks/gpu_calls/gpu_call*.sh), sourced after `set -u` and after
# `logs` names the folder for the logs:
#   json LOG...         the last JSON line of a benchmark log (rank 0's under a launcher), as key=value
#   t NAME SECONDS BIN ARGS...
#                       runs the bundled test .gpu/run BIN ARGS within SECONDS into $logs/NAME.log and
#                       prints its rc, the PASSED/FAILED/SKIPPED summary lines and the first failures
#   ours_1b TAG ARGS... the 1b step on one GPU (20 timed steps after 5, within ${OURS_TIMEOUT:-120} s) into
#                       $logs/ours_TAG.log, its JSON line
#   peer_1b             the peer's 1b step (torch.compile, 20 timed steps after 8, within 150 s) into
#                       $logs/peer_1b.log, its JSON line
#   fsdp_1b TAG ARGS... the 1b FSDP step on 2 GPUs under 25 GiB (IPC collectives; ${steps:-12} steps after 4)
#                       into $logs/fsdp_TAG.log, its JSON line
#   bm NAME FILTER [FLAG...]
#                       the embedding benchmarks matching FILTER (${BM_REPS:-3} repetitions, within
#                       ${BM_TIMEOUT:-60} s; the host-side setup of a table takes seconds) into
#                       $logs/bm_NAME.csv, on ${BM_GPU:-0}; FLAGs go to the benchmark binary
#   bm_table            the median TB/s and time of every bm run so far, one line per benchmark
json() {
  grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
keys=("tokens_per_s_per_gpu","step_ms_median","peak_gib","planned_arena_gib","mfu","gpu_millijoules_per_token","gpu_mean_watts","sm_clock_median_mhz","gpu_temperature_max_c","loss_first","loss_last",
      "recompute","recompute_swiglu_layers","lm_head_chunks","fused_swiglu_backward","bf16_gradients","autotune","autotune_energy_ms","shipped_tuning","tuned_choices","metered_choices","metered_choices_not_fastest","offload_activations","fsdp_host_gradient_units","offload_host_gib","cuda_graph")
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in keys if k in j))'
}
t() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -4
}
ours_1b() {
  local tag=$1
  shift
  timeout "${OURS_TIMEOUT:-120}" .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=20 --warmup=5 "$@" > "$logs/ours_$tag.log" 2>&1
  echo "ours 1b $tag: $(json "$logs/ours_$tag.log") $(grep -E 'rror' "$logs/ours_$tag.log" | tail -1 | cut -c1-160)"
}
peer_1b() {
  timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
  echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
}
fsdp_1b() {
  local tag=$1
  shift
  SG_COMM_IPC=1 timeout 150 .gpu/run comm/launch --nproc=2 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps="${steps:-12}" --warmup=4 "$@" \
    > "$logs/fsdp_$tag.log" 2>&1
  echo "fsdp 1b 25 $tag: $(json "$logs/fsdp_$tag.log") $(grep -E 'rror' "$logs/fsdp_$tag.log" | head -1 | cut -c1-200)"
}
# The 1b as FSDP over a group of one (comm/launch --nproc=1): a one-GPU stand-in for a 2-GPU plan.
fsdp_over_one() {
  local tag=$1
  shift
  timeout 150 .gpu/run comm/launch --nproc=1 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=1b --strategy=fsdp --steps=12 --warmup=4 "$@" > "$logs/one_$tag.log" 2>&1
  echo "1b fsdp over one $tag: $(json "$logs/one_$tag.log") $(grep -E 'rror' "$logs/one_$tag.log" | head -1 | cut -c1-200)"
}
bm() {
  CUDA_VISIBLE_DEVICES=${BM_GPU:-0} timeout "${BM_TIMEOUT:-60}" .gpu/run kernels/embedding/embedding_benchmark \
    --benchmark_filter="$2" --benchmark_repetitions="${BM_REPS:-3}" --benchmark_report_aggregates_only=true \
    --benchmark_format=csv "${@:3}" > "$logs/bm_$1.csv" 2> "$logs/bm_$1.err"
  echo "bm $1 rc=$?"
}
bm_table() {
  python3 - "$logs" <<'PY'
import csv, glob, sys, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/bm_*.csv")):
    lines = [l for l in open(f) if l.startswith('"BM_') or l.startswith("name,")]
    for r in csv.DictReader(lines):
        if r["name"].endswith("_median"):
            rows[r["name"].replace("_median", "").replace("BM_EmbeddingBackwardBF16", "")].append(
                f"{float(r['median_TBps']):.3f} TB/s {float(r['real_time'])/1e3:.1f} us")
for k, v in rows.items(): print(f"{k:52s} {' | '.join(v)}")
PY
}
