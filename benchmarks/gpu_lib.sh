# Helpers for the one-call GPU scripts (benchmarks/gpu_call*.sh), sourced after `set -u` and after
# `logs` names the folder for the logs:
#   json LOG...         the last JSON line of a benchmark log (rank 0's under a launcher), as key=value
#   t NAME SECONDS BIN ARGS...
#                       runs the bundled test .gpu/run BIN ARGS within SECONDS into $logs/NAME.log and
#                       prints its rc, the PASSED/FAILED/SKIPPED summary lines and the first failures
json() {
  grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
keys=("tokens_per_s_per_gpu","step_ms_median","peak_gib","planned_arena_gib","mfu","loss_first","loss_last",
      "recompute","recompute_swiglu_layers","offload_activations","offload_host_gib","cuda_graph")
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in keys if k in j))'
}
t() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -4
}
