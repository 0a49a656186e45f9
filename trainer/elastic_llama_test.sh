#!/usr/bin/env bash
# Issue 12's elastic test on the real trainer (tiny preset, CPU, FSDP, per-shard checkpoints every
# 2 steps): rank 2 of a 4-rank run SIGKILLs itself in the middle of step 5. Every survivor must
# name it (rank, collective, sequence number) with the default settings (health deadline 30 s,
# launcher grace 5 s): the launcher's SIGTERM makes each survivor look at once, and a process
# gone from this host is named without waiting out the deadline. The launcher restarts
# with 3 ranks, which reload step 4 (saved on 4 ranks, resharded to 3) and train to step 8. No
# checkpointed step is lost, the loss curve continues where it left off, and every step after the
# restart matches an uninterrupted 3-rank run from a copy of the same checkpoint (relative 1e-6;
# the CPU step is deterministic, so they are expected to be equal).
set -euo pipefail
llama=$(realpath "$1") launch=$(realpath "$2")
work=${TEST_TMPDIR:-$(mktemp -d)}
cd "$work"
rm -rf runs
deadline=30  # the trainer's default; fault_detection_test.sh covers faults that take the deadline
common=(--device=cpu --strategy=fsdp --checkpoint_format=sharded --checkpoint_every=2 --batch=2 --seq=64
        --eval_batches=1 --sample_tokens=1 --seed=7 --steps=8 --health_deadline_s=$deadline)
start=$(date +%s)
"$launch" --nproc=4 --max_restarts=1 --min_nproc=2 -- \
  "$llama" "${common[@]}" --name=elastic --resume=auto --inject_fault=kill_in_step:2:5 > elastic.log 2>&1 \
  || { cat elastic.log; echo "FAIL: the elastic run did not finish"; exit 1; }
mkdir -p runs/again
cp -r runs/elastic/step_00000004 runs/again/
"$launch" --nproc=3 -- "$llama" "${common[@]}" --name=again --resume=runs/again/step_00000004 > again.log 2>&1 \
  || { cat again.log; echo "FAIL: the uninterrupted 3-rank run failed"; exit 1; }
echo "both runs took $(( $(date +%s) - start )) s"
python3 - elastic.log runs/elastic/metrics.jsonl runs/again/metrics.jsonl <<'PY'
import json, re, sys
log_path, elastic_path, again_path = sys.argv[1:4]
grace = 5.0  # the launcher's default: the survivors are SIGKILLed after it
log = open(log_path, errors="replace").read()
def need(text, what):
    assert text in log, f"{what}: expected the line '{text}' in {log_path}:\n{log}"
need("launch: rank 2 exited with code 137", "the launcher saw the SIGKILL")
need("launch: restarting with 3 ranks (restart 1 of 1)", "the launcher restarted with the survivors")
need("[rank 0] resumed : step 4 from runs/elastic/step_00000004 (per-shard, saved on 4 ranks, now 3)",
     "the restart reloaded the last checkpoint, resharded 4 -> 3")
# Every survivor names the lost rank, the collective and its sequence number, well before the
# deadline: within the launcher's grace period.
for r in (0, 1, 3):
    m = re.search(rf"\[rank {r}\] health: rank 2 died \(process \d+ is gone; no heartbeat for ([0-9.]+)(m?s)?\); "
                  rf"it last entered (\w+) #(\d+)", log)
    assert m, f"rank {r} did not report rank 2's death with its operation and sequence number:\n{log}"
    silent = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)  # absl prints a zero as "0"
    assert silent < grace, f"rank {r} reported rank 2 after {silent} s of silence, beyond the launcher's grace"
    print(f"rank {r}: rank 2 died, last in {m.group(3)} #{m.group(4)}, reported after {silent:.2f} s of silence")

def losses(path):
    out = {}
    for rec in map(json.loads, filter(str.strip, open(path))):
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]  # a redone step keeps its last value
    return out
elastic, again = losses(elastic_path), losses(again_path)
assert sorted(elastic) == list(range(1, 9)), f"expected steps 1..8 in {elastic_path}, found {sorted(elastic)}"
assert sorted(again) == list(range(5, 9)), f"expected steps 5..8 in {again_path}, found {sorted(again)}"
# The curve continues: the first step on 3 ranks is near step 4's loss, far below the start.
assert abs(elastic[5] - elastic[4]) < 0.5 and elastic[5] < elastic[1] - 0.2, f"the loss curve jumped: {elastic}"
worst = 0.0
for t in range(5, 9):
    rel = abs(elastic[t] - again[t]) / abs(again[t])
    worst = max(worst, rel)
    print(f"step {t}: restarted {elastic[t]:.6f}   uninterrupted 3 ranks {again[t]:.6f}")
assert worst <= 1e-6, f"restarted and uninterrupted 3-rank losses differ by {worst:.2e} (relative), tolerance 1e-6"
print(f"max relative difference {worst:.2e}; faults injected 1, survived 1")
PY
