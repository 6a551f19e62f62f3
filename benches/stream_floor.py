#!/usr/bin/env python3
"""optirs-tpu's streaming floor against numpy on this machine, in one run.

The floor (`src/memory/stream.rs`) is the best rate of an in-place add, a
read-only sum and a copy, on one thread and on every core, over the
operation's working set. A peer that streams faster than it would mean the
floor is not one. Each round, back to back:

* numpy's single-threaded in-place add `np.add(p, g, out=p)` on `--size`
  `f32` (12 bytes per element: `p` and `g` read, `p` written), its read-only
  sum `p.sum() + g.sum()` (8 bytes) and its copy `np.copyto(p, g)` (8 bytes),
  each the best of `--reps` passes on warm buffers;
* `target/release/optirs-tpu bench optimizer --optimizer sgd --size SIZE
  --json` (SGD's working set is the same two arrays: its floor is taken over
  the same bytes), whose `floor_gbps` is the floor's rate;
* with `--collectives`, `optirs-tpu collectives assets/pods/examples/v2-4x2-custom.ron --op OP --sizes
  4194304,16777216 --json` for every op.

Prints every figure with the load average before and after, and exits 1 if
numpy's best rate beat the floor in any round, or any `ratio_to_floor` is
below 1.

    cargo build --release
    python3 benches/stream_floor.py [--size 1e7] [--rounds 3] [--collectives]

Not part of `cargo test` or CI: it is a benchmark.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "release", "optirs-tpu")
COLLECTIVE_OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"]


def best_of(reps, f):
    f()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - start)
    return best


def numpy_rates(size, reps):
    """GB/s of numpy's in-place add, read-only sum and copy on `size` f32."""
    import numpy as np

    p = (np.arange(size, dtype=np.float32) % 7)
    g = ((np.arange(size, dtype=np.float32) % 3) - 1.0) * np.float32(1e-7)
    sink = []
    rates = {
        "add": 12 * size / best_of(reps, lambda: np.add(p, g, out=p)) / 1e9,
        "sum": 8 * size / best_of(reps, lambda: sink.append(p.sum() + g.sum())) / 1e9,
        "copy": 8 * size / best_of(reps, lambda: np.copyto(p, g)) / 1e9,
    }
    return rates


def ours(args):
    out = subprocess.run([BINARY, *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--collectives", action="store_true")
    args = parser.parse_args()
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("numpy does not import: the numpy side is skipped")
        numpy_ok = False
    else:
        numpy_ok = True
    load_before = os.getloadavg()
    failures = []
    print(f"| round | floor GB/s | floor kernel | numpy add | numpy sum | numpy copy "
          f"| floor / best numpy | SGD in place / floor | SGD warm / floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in range(args.rounds):
        rates = numpy_rates(args.size, args.reps) if numpy_ok else {}
        b = ours(["bench", "optimizer", "--optimizer", "sgd", "--size", str(args.size)])
        best = max(rates.values(), default=0.0)
        print(f"| {r + 1} | {b['floor_gbps']:.1f} | {b['floor_kernel']} on {b['floor_threads']} "
              f"| {rates.get('add', 0):.1f} | {rates.get('sum', 0):.1f} | {rates.get('copy', 0):.1f} "
              f"| {b['floor_gbps'] / best if best else float('nan'):.2f} "
              f"| {b['ratio_to_floor']:.2f} | {b['warm_ratio_to_floor']:.2f} |")
        if best > b["floor_gbps"]:
            failures.append(f"round {r + 1}: numpy {best:.1f} GB/s beat the floor "
                            f"{b['floor_gbps']:.1f} GB/s")
        for key in ("ratio_to_floor", "warm_ratio_to_floor", "fresh_ratio_to_floor"):
            if b[key] < 1:
                failures.append(f"round {r + 1}: sgd {key} {b[key]:.3f}")
    if args.collectives:
        print("\n| op | bytes per rank | measured us | floor us | ratio_to_floor |")
        print("|---|---|---|---|---|")
        for op in COLLECTIVE_OPS:
            for row in ours(["collectives", "assets/pods/examples/v2-4x2-custom.ron", "--op", op, "--sizes", "4194304,16777216"]):
                print(f"| {row['op']} | {row['bytes']} | {row['measured_seconds'] * 1e6:.0f} "
                      f"| {row['floor_seconds'] * 1e6:.0f} | {row['ratio_to_floor']:.2f} |")
                if row["ratio_to_floor"] < 1:
                    failures.append(f"{op} {row['bytes']}: ratio_to_floor "
                                    f"{row['ratio_to_floor']:.3f}")
    load_after = os.getloadavg()
    print(f"\nsize {args.size} f32; load average before {load_before[0]:.2f} "
          f"{load_before[1]:.2f} {load_before[2]:.2f}, after {load_after[0]:.2f} "
          f"{load_after[1]:.2f} {load_after[2]:.2f}")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
