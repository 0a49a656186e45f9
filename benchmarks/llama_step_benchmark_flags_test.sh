#!/bin/bash
# llama_step_benchmark as a process: bad values and unknown flags are usage errors that name the
# flag (Abseil's type errors exit 1, the benchmark's own range/enum checks exit 2), and the flags the
# GPU scripts pass still parse (a one-step tiny run on the CPU).
set -u
source "$1"  # tools/expect_exit.sh: expect CODE TEXT ARGS...
bin="$2"
expect 1 "Illegal value 'abc' specified for flag 'steps'" --steps=abc
expect 1 "Unknown command line flag 'step'" --step=3
expect 1 "Illegal value 'sometimes' specified for flag 'autotune'" --autotune=sometimes
expect 2 "--recompute: expected auto|none|selective|full, found 'partial'" --recompute=partial
expect 2 "--steps: expected >= 1, found 0" --steps=0
expect 2 "--strategy: expected none|fsdp|hsdp, found 'ddp'" --strategy=ddp
expect 2 "--config: " --config=13b
expect 2 "--micro_batches: expected >= 1, found 0" --micro_batches=0
expect 2 "--lm_head_chunks: expected >= 1, found 0" --lm_head_chunks=0
expect 2 "--fsdp_host_gradient_units: expected -1 (auto) or a count >= 0, found -2" --fsdp_host_gradient_units=-2
expect 2 "--fsdp_host_gradient_units: expected --strategy=fsdp, found --strategy=none" --fsdp_host_gradient_units=3
expect 2 "--recompute_swiglu_layers: expected -1 (all) or a count >= 0, found -3" --recompute_swiglu_layers=-3
expect 2 "--recompute_swiglu_layers: expected --recompute=selective, found --recompute=auto" --recompute_swiglu_layers=0
expect 2 "--offload_activations: expected -1 (none or auto's) or a count >= 0, found -2" --offload_activations=-2
expect 2 "--offload_activations: expected --recompute=none|selective|full (auto chooses its own), found --recompute=auto" --offload_activations=2
expect 2 "--energy_profile_ms: expected >= 0 (0: off), found -1" --energy_profile_ms=-1
expect 2 "--energy_profile_ms: expected a CUDA step (--device=cuda or unset), found --device=cpu" --device=cpu --energy_profile_ms=100
expect 2 "--energy_profile_ms: expected --strategy=none (a group's steps replay alone, without their collectives), found --strategy=fsdp" --strategy=fsdp --energy_profile_ms=100
expect 2 "--autotune_energy_ms: expected 0 (off) or >= 300 (three updates of the energy counter), found 100" --autotune_energy_ms=100
expect 2 "--autotune_energy_ms: expected --autotune=1 (it ranks the tuned candidates), found --autotune=0" --autotune=0 --autotune_energy_ms=1000
expect 2 "--autotune_energy_ms: expected a CUDA step (--device=cuda or unset), found --device=cpu" --device=cpu --autotune_energy_ms=1000
expect 2 "--autotune_energy_within: expected a factor >= 1, found 0.9" --autotune_energy_within=0.9
expect 2 "--autotune_energy_candidates: expected >= 1, found 0" --autotune_energy_candidates=0
expect 2 "--autotune_energy_variants: expected >= 0, found -1" --autotune_energy_variants=-1
expect 2 "--gradients: expected auto|f32|bf16, found 'f16'" --gradients=f16
expect 2 "--gradients=bf16: expected --micro_batches=1 (accumulation adds gradients in f32), found --micro_batches=2" --micro_batches=2 --gradients=bf16
expect 2 "expected only --flag=value arguments, found 'tiny'" tiny
tiny=(--config=tiny --device=cpu --steps=1)
expect 0 '"config":"tiny"' "${tiny[@]}" --warmup=1 --recompute=auto --memory_budget_gib=2 --lr=1e-3 --cuda_graph=0
expect 0 '"recompute":"selective"' "${tiny[@]}" --warmup=0 --recompute=selective --strategy=none
expect 0 '"recompute_swiglu_layers":0' "${tiny[@]}" --warmup=0 --recompute=selective --recompute_swiglu_layers=0
expect 0 '"offload_activations":2' "${tiny[@]}" --warmup=1 --recompute=selective --recompute_swiglu_layers=0 --offload_activations=2
expect 0 '"wgrad_stream":true' "${tiny[@]}" --warmup=1 --wgrad_stream
expect 0 '"micro_batches":2' "${tiny[@]}" --warmup=1 --recompute=none --micro_batches=2
expect 0 '"micro_batches":2' "${tiny[@]}" --warmup=1 --micro_batches=2
expect 0 '"lm_head_chunks":4' "${tiny[@]}" --warmup=1 --lm_head_chunks=4
expect 0 '"bf16_gradients":true' "${tiny[@]}" --warmup=1
expect 0 '"bf16_gradients":false' "${tiny[@]}" --warmup=1 --gradients=f32
expect 0 '"autotune":false' "${tiny[@]}" --warmup=1 --autotune=0
expect 0 '"bf16_gradients":false' "${tiny[@]}" --warmup=1 --micro_batches=2
cache="${TEST_TMPDIR:-/tmp}/bench_cache"
expect 0 '"autotune_energy_ms":0' "${tiny[@]}" --warmup=1 --cache_dir="$cache"
expect 0 '"tuned_choices":0' "${tiny[@]}" --warmup=1 --cache_dir="$cache"
exit $fail
