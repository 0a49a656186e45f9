#!/usr/bin/env python3
"""Per-operation time of two step traces (llama_step_benchmark --trace=...), side by side.

Sums each trace's events by thread (compute, communication, host copies, weight gradients) and by
operation name with layer numbers folded ("matmul @layers.#.feed_forward.w#"), and prints the
groups whose totals differ most, so the cost of a change (or of FSDP against one GPU) can be read
off the two timelines.

    python3 benchmarks/trace_diff.py a.json b.json [--top 30] [--scope]   # --scope keeps "@..." parts
"""
import argparse
import collections
import json
import re
import sys

THREADS = {0: "compute", 1: "communication", 2: "host copies", 3: "weight gradients"}


def load(path, keep_scope):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_diff: cannot read {path}: {e}")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        sys.exit(f"trace_diff: {path}: expected a Chrome trace (a traceEvents list), found {type(events).__name__}")
    sums = collections.defaultdict(float)
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = re.sub(r"\d+", "#", str(e.get("name", "?")))
        if not keep_scope and not name.startswith("matmul"):
            name = re.sub(r" @.*", "", name)
        sums[(THREADS.get(e.get("tid"), str(e.get("tid"))), name)] += float(e.get("dur", 0)) / 1e3
    return sums


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--scope", action="store_true", help="keep each operation's scope (layer names)")
    args = p.parse_args()
    a, b = load(args.a, args.scope), load(args.b, args.scope)
    keys = sorted(set(a) | set(b), key=lambda k: -abs(a.get(k, 0) - b.get(k, 0)))
    print(f"{'thread':<17} {'operation':<58} {'a ms':>9} {'b ms':>9} {'b - a':>8}")
    for k in keys[: args.top]:
        print(f"{k[0]:<17} {k[1][:58]:<58} {a.get(k, 0):9.2f} {b.get(k, 0):9.2f} {b.get(k, 0) - a.get(k, 0):+8.2f}")
    for thread in THREADS.values():
        ta = sum(v for k, v in a.items() if k[0] == thread)
        tb = sum(v for k, v in b.items() if k[0] == thread)
        if ta or tb:
            print(f"{thread:<17} {'(total)':<58} {ta:9.2f} {tb:9.2f} {tb - ta:+8.2f}")


if __name__ == "__main__":
    main()
