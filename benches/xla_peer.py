#!/usr/bin/env python3
"""optirs-tpu against XLA-CPU on this machine, side by side in one run.

Times, where `jax` and `optax` import:

* optimizer steps: `jax.jit` of the optax update with the params and the
  state donated (`donate_argnums`), median of `--steps` (>= 20) steps;
* collectives over 8 host devices
  (`XLA_FLAGS=--xla_force_host_platform_device_count=8`): `shard_map` with
  `psum`, `psum_scatter`, `all_gather` and `all_to_all` at 4 MB and 16 MB per rank, busbw
  as nccl-tests defines it (`S / t` times `2(n-1)/n` for all-reduce and
  `(n-1)/n` for reduce-scatter, all-gather and all-to-all, `S` the buffer per rank);

then runs `target/release/optirs-tpu bench optimizer --json` and
`optirs-tpu collectives --json` (the 8-chip `assets/pods/examples/v2-4x2-custom.ron` pod) for the same sizes
and prints one table: ours, XLA, the streaming floor and the ratios, with the
machine's load average before and after. XLA's steps run back to back on the
same buffers, so the comparison uses ours and the floor timed the same way
(`bench optimizer`'s `warm_*` figures); `bench optimizer`'s rotated rounds,
where every side finds its buffers evicted, are shown beside them. `--rounds` repeats both sides
back to back; each ratio is then the median of the per-round ratios, with
their range, so drift between the processes shows instead of being
hidden. Without jax the optirs-tpu figures are still printed, with a note
that the XLA ones are skipped.

    cargo build --release
    python3 benches/xla_peer.py [--size 1e7] [--optimizer adam,sgd] [--rounds 3]

Not part of `cargo test` or CI: it is a benchmark.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "release", "optirs-tpu")
RANKS = 8
COLLECTIVE_SIZES = [4 << 20, 16 << 20]
COLLECTIVE_OPS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]
LEARNING_RATE = 1e-3


def bus_factor(op, n):
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


# --- XLA side: each part runs in its own process (the flag that splits the
# host into 8 devices must not apply to the optimizer steps). ---------------


def xla_optimizer(name, size, steps):
    import jax
    import jax.numpy as jnp
    import optax

    tx = {
        "sgd": lambda: optax.sgd(LEARNING_RATE),
        "momentum": lambda: optax.sgd(LEARNING_RATE, momentum=0.9),
        "nesterov": lambda: optax.sgd(LEARNING_RATE, momentum=0.9, nesterov=True),
        "adam": lambda: optax.adam(LEARNING_RATE),
        "adamw": lambda: optax.adamw(LEARNING_RATE, weight_decay=1e-4),
        "rmsprop": lambda: optax.rmsprop(LEARNING_RATE),
        "adagrad": lambda: optax.adagrad(LEARNING_RATE),
    }[name]()

    def step(p, s, g):
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s

    step = jax.jit(step, donate_argnums=(0, 1))
    i = jnp.arange(size, dtype=jnp.int32)
    p = ((i % 1000).astype(jnp.float32) - 500.0) * 1e-3
    g = ((i % 777).astype(jnp.float32) - 388.0) * 1e-4
    s = tx.init(p)
    t = time.perf_counter()
    p, s = step(p, s, g)
    jax.block_until_ready(p)
    compile_seconds = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        p, s = step(p, s, g)
        jax.block_until_ready((p, s))
        times.append(time.perf_counter() - t)
    return {
        "optimizer": name,
        "size": size,
        "step_seconds": statistics.median(times),
        "first_step_seconds": compile_seconds,
        "jax": jax.__version__,
        "optax": optax.__version__,
    }


def xla_collectives(steps):
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    try:
        shard_map = jax.shard_map
    except AttributeError:
        from jax.experimental.shard_map import shard_map
    devices = jax.devices()
    if len(devices) != RANKS:
        raise SystemExit(f"expected {RANKS} host devices, found {len(devices)}")
    mesh = Mesh(devices, ("d",))
    body = {
        "all_reduce": lambda x: jax.lax.psum(x, "d"),
        "reduce_scatter": lambda x: jax.lax.psum_scatter(x, "d", tiled=True),
        "all_gather": lambda x: jax.lax.all_gather(x, "d", tiled=True),
        # Each rank's S split into one chunk per rank, chunk j to rank j.
        "all_to_all": lambda x: jax.lax.all_to_all(x, "d", 0, 0, tiled=True),
    }
    rows = []
    for op in COLLECTIVE_OPS:
        f = jax.jit(shard_map(body[op], mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        for size in COLLECTIVE_SIZES:
            per_rank = size // 4
            # all_gather takes S/n per rank and gathers S; the others take S.
            local = per_rank // RANKS if op == "all_gather" else per_rank
            x = jax.device_put(
                (jnp.arange(RANKS * local) % 7).astype(jnp.float32),
                jax.sharding.NamedSharding(mesh, P("d")),
            )
            jax.block_until_ready(f(x))
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                jax.block_until_ready(f(x))
                times.append(time.perf_counter() - t)
            seconds = statistics.median(times)
            rows.append(
                {
                    "op": op,
                    "bytes": size,
                    "seconds": seconds,
                    "busbw_gbps": size / seconds / 1e9 * bus_factor(op, RANKS),
                }
            )
    return rows


def run_part(part, args, extra_env=None):
    env = dict(os.environ)
    env.update(extra_env or {})
    cmd = [sys.executable, os.path.abspath(__file__), "--part", part,
           "--size", str(args.size), "--steps", str(args.steps), "--optimizer", args.optimizer]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"note: the XLA {part} part failed:\n{out.stderr.strip()[-2000:]}")
        return None
    return json.loads(out.stdout)


# --- optirs-tpu side ---------------------------------------------------------


def ours(cmd):
    out = subprocess.run([BINARY] + cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"`optirs-tpu {' '.join(cmd)}` failed:\n{out.stderr}")
    return json.loads(out.stdout)


def ms(s):
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"


def fmt_size(n):
    text = f"{n:.0e}".replace("e+0", "e").replace("e+", "e")
    return text if float(text) == n else str(n)


def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "—"


def parse_size(text):
    value = float(text.replace("_", ""))
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"`{text}` is not a positive whole number")
    return int(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=10_000_000,
                        help="f32 parameters of the optimizer steps (default 1e7)")
    parser.add_argument("--optimizer", default="adam,sgd",
                        help="comma-separated optimizers (default adam,sgd)")
    parser.add_argument("--steps", type=int, default=21,
                        help="timed steps per figure, at least 20 (default 21)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, each running XLA and optirs-tpu back to back; figures are "
                             "medians over rounds, ratios the median of per-round ratios with "
                             "their range (default 3)")
    parser.add_argument("--part", choices=["optimizer", "collectives"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 20:
        parser.error("--steps must be at least 20")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    names = [n.strip().lower() for n in args.optimizer.split(",") if n.strip()]

    if args.part == "optimizer":
        print(json.dumps([xla_optimizer(n, args.size, args.steps) for n in names]))
        return
    if args.part == "collectives":
        print(json.dumps(xla_collectives(args.steps)))
        return

    if not os.path.exists(BINARY):
        raise SystemExit(f"{BINARY} is missing: run `cargo build --release` first")
    load_before = os.getloadavg()
    try:
        import jax  # noqa: F401
        import optax  # noqa: F401
        have_xla = True
    except ImportError as e:
        have_xla = False
        print(f"note: {e}; XLA figures are skipped (pip install jax optax)")

    sizes = ",".join(str(s) for s in COLLECTIVE_SIZES)
    flags = (os.environ.get("XLA_FLAGS", "") +
             f" --xla_force_host_platform_device_count={RANKS}").strip()
    rounds = []
    for _ in range(args.rounds):
        xla_opt = run_part("optimizer", args) if have_xla else None
        our_opt = [
            ours(["bench", "optimizer", "--optimizer", n, "--size", str(args.size),
                  "--steps", str(args.steps), "--json"])
            for n in names
        ]
        xla_coll = run_part("collectives", args, {"XLA_FLAGS": flags}) if have_xla else None
        our_coll = {
            op: ours(["collectives", "assets/pods/examples/v2-4x2-custom.ron", "--op", op, "--sizes", sizes, "--json"])
            for op in COLLECTIVE_OPS
        }
        rounds.append((xla_opt, our_opt, xla_coll, our_coll))
    load_after = os.getloadavg()

    def fmt_load(load):
        return " ".join(f"{x:.2f}" for x in load)

    def median(values):
        values = [v for v in values if v]
        return statistics.median(values) if values else None

    def ratios(pairs):
        """Median of per-round ratios a/b, with their range."""
        rs = sorted(a / b for a, b in pairs if a and b)
        if not rs:
            return "—"
        mid = statistics.median(rs)
        return f"{mid:.2f}×" if len(rs) == 1 else f"{mid:.2f}× ({rs[0]:.2f}–{rs[-1]:.2f})"

    xla_of = lambda r, i: r[0][i]["step_seconds"] if r[0] else None  # noqa: E731
    versions = ""
    first_xla = next((r[0] for r in rounds if r[0]), None)
    if first_xla:
        versions = f" (jax {first_xla[0]['jax']}, optax {first_xla[0]['optax']})"
    print(f"\noptirs-tpu against XLA-CPU{versions}; {os.cpu_count()} CPUs; "
          f"load average before {fmt_load(load_before)}, after {fmt_load(load_after)}; "
          f"{len(rounds)} round(s): medians over rounds, ratios per round (median and range)\n")
    # XLA's steps are timed back to back on the same buffers, so ours are
    # compared warm too (`warm_*`); the rotated figures are `bench
    # optimizer`'s rounds, where every side finds its buffers evicted.
    print("| optimizer step | size | ours in place | XLA (jit + donation) | floor "
          "| in place / XLA | in place / floor | XLA / floor | ours in place, rotated "
          "| ours fresh output, rotated |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, name in enumerate(names):
        o = [r[1][i] for r in rounds]
        x = [xla_of(r, i) for r in rounds]
        inp = [v["warm_in_place_step_seconds"] for v in o]
        fl = [v["warm_floor_seconds"] for v in o]
        xm = median(x)
        print(f"| {name} | {fmt_size(o[0]['size'])} | {ms(median(inp))} "
              f"| {ms(xm) if xm else 'skipped'} | {ms(median(fl))} "
              f"| {ratios(zip(inp, x))} | {ratios(zip(inp, fl))} | {ratios(zip(x, fl))} "
              f"| {ms(median([v['in_place_step_seconds'] for v in o]))} "
              f"| {ms(median([v['step_seconds'] for v in o]))} |")
    print(f"\n| collective, {RANKS} ranks | bytes per rank | ours busbw | XLA busbw | ours / XLA |")
    print("|---|---|---|---|---|")
    for op in COLLECTIVE_OPS:
        for k, row in enumerate(rounds[0][3][op]):
            ours_bw = [r[3][op][k]["busbw_gbps"] for r in rounds]
            xla_bw = []
            for r in rounds:
                x = None
                if r[2]:
                    x = next((c["busbw_gbps"] for c in r[2]
                              if c["op"] == op and c["bytes"] == row["bytes"]), None)
                xla_bw.append(x)
            xm = median(xla_bw)
            xs = f"{xm:.2f} GB/s" if xm else "skipped"
            print(f"| {op} | {row['bytes'] >> 20} MiB | {median(ours_bw):.2f} GB/s | {xs} "
                  f"| {ratios(zip(ours_bw, xla_bw))} |")
    print("\nsteps: a run of passes in a row over the same buffers, as XLA's are "
          "(`bench optimizer`'s warm_in_place_step_seconds); floor: the bytes the update "
          "must move at the machine's streaming floor (best of an add, a sum and a copy "
          "with every core, `floor_gbps`; `benches/stream_floor.py` checks it against "
          "numpy); ratios "
          "are of times for steps, of busbw for collectives (above 1× is faster for "
          "collectives, slower for steps).")


if __name__ == "__main__":
    main()
