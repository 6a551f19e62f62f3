#!/bin/bash
# Records what the commands print that a refactor must keep: the world digest
# of `run` on every preset and example pod, `train` (default, a kill under
# redundant and rollback recovery, the twisted torus, spare cubes, modeled),
# `goodput` on the bundled cases and `compile` on every program, with wall
# times removed. Compare two builds with `diff -r`.
# usage: record.sh BINARY OUTDIR
B=$1; O=$2; mkdir -p $O
j() { python3 -c "import json,sys
def strip(x):
  if isinstance(x,dict):
    [x.pop(k) for k in list(x) if k in ('micros','wall_seconds','compile_seconds')]
    [strip(v) for v in x.values()]
  elif isinstance(x,list): [strip(v) for v in x]
d=json.load(sys.stdin); [d.pop(k,None) for k in ('wall_seconds','wall_seconds_per_step','compile_seconds','build_seconds','wall_ns_per_tick','performance','topology_seconds')]; strip(d); print(json.dumps(d,sort_keys=True))"; }
# The bundled preset files (the catalogue's other sizes are generated the
# same way) and the example pods.
for p in v2-8 v3-64 v4-16 v4-128 v4-8192 v5e-16 v5e-256 v5p-256 v6e-256 tpu7x-512 assets/pods/examples/*.ron; do
  echo "run $p: $($B run $p --steps 200 --json | j | python3 -c 'import json,sys; print(json.load(sys.stdin)["world_sha256"])')"
done > $O/run.txt
{
echo "train default: $($B train --json | j)"
echo "train kill redundant: $($B train --json --params 1000000 --steps 4 --kill 3@0.00017 --recovery redundant | j)"
echo "train kill rollback: $($B train --json --params 1000000 --steps 300 --kill 5@0.03 --checkpoint-every 0.02 | j)"
echo "train twisted: $($B train assets/pods/examples/v4-4x4x8-twisted.ron --json --params 1000000 --steps 2 | j)"
echo "train cubes: $($B train assets/pods/examples/v4-4x4x8-cubes.ron --json --params 100000 --steps 3 --kill 5@0.0001 --recovery spare-cube --checkpoint-every 0.00005 | j)"
echo "train modeled: $($B train v5p-256 --modeled-only --params 1e9 --json | j)"
} > $O/train.txt 2>&1
{
echo "goodput default: $($B goodput v5e-16 --model-params 1e9 --mtbf-hours 1000 --days 5 --json | j)"
echo "goodput async: $($B goodput v4-128 --model-params 1e11 --mtbf-hours 2000 --days 10 --step-seconds 5 --checkpoint-every 600 --json | j)"
echo "goodput async2: $($B goodput v4-128 --model-params 1e11 --mtbf-hours 2000 --days 10 --step-seconds 5 --checkpoint-every 600 --async-checkpoint --json | j)"
echo "goodput redundant: $($B goodput v5e-256 --model-params 1e10 --mtbf-hours 5000 --days 20 --recovery redundant --json | j)"
echo "goodput cubes: $($B goodput assets/pods/examples/v4-4x4x8-cubes.ron --model-params 1e10 --mtbf-hours 5000 --days 20 --recovery spare-cube --json | j)"
echo "goodput host: $($B goodput v4-128 --model-params 1e9 --mtbf-hours 500 --days 3 --failure-unit host --json | j)"
echo "compile: $(for f in assets/programs/*.ron; do $B compile $f --json | j | sha256sum; done)"
} > $O/goodput.txt 2>&1
