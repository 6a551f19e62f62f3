#!/bin/sh
# All-reduce across MPI ranks: optirs-tpu's split-pod collective
# (benches/ranked_allreduce.rs) against OpenMPI's own MPI_Allreduce
# (benches/mpi_allreduce.c) on the same bytes, in alternating rounds, with
# the shared-memory floor measured in the same run. The v4-16 torus holds
# 8/RANKS devices' buffers per rank, so MPI_Allreduce also runs on that
# many bytes per rank (its "bytes" field says which): the torus's peer.
# Ours runs each layout over messages and through the ranks' shared window
# (the "window" rows; "staged" copies the caller's buffers in and out).
#
# The run fails (like nccl-tests' #wrong) if any element of any round of
# ours differs from the single-process reduction in the canonical order:
# the bench binary counts them ("wrong" in its JSON) and exits with status
# 1, and `set -e` stops here.
#
#   sh benches/ranked_allreduce.sh [RANKS [BYTES... ]]
#
# Needs OpenMPI (mpicc, mpirun) and a build with the `mpi` feature.
set -eu
cd "$(dirname "$0")/.."
ranks=${1:-2}
[ $# -gt 0 ] && shift
sizes=${*:-4194304 16777216}
rounds=${ROUNDS:-20}
pairs=${PAIRS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p target
mpicc -O2 -o target/mpi_allreduce benches/mpi_allreduce.c
ours=$(cargo bench --features mpi --bench ranked_allreduce --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "ranked_allreduce" and m.get("executable"):
        print(m["executable"])')
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for bytes in $sizes; do
    i=0
    while [ "$i" -lt "$pairs" ]; do
        mpirun -n "$ranks" --oversubscribe "$ours" "$bytes" "$rounds"
        mpirun -n "$ranks" --oversubscribe target/mpi_allreduce "$bytes" "$rounds"
        mpirun -n "$ranks" --oversubscribe target/mpi_allreduce "$((bytes * 8 / ranks))" "$rounds"
        i=$((i + 1))
    done
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
