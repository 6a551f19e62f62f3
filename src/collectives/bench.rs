//! nccl-tests-style measurement of the collectives on this CPU, next to
//! their modeled time on a pod's links.
//!
//! Conventions follow nccl-tests (`doc/PERFORMANCE.md` there): for a buffer
//! of `S` bytes per rank and a time `t`,
//!
//! * `algbw = S / t`;
//! * `busbw = algbw · 2(n−1)/n` for all-reduce, `· (n−1)/n` for
//!   reduce-scatter and all-gather, `· 1` for broadcast: the per-link
//!   bandwidth the ring needs to reach that `algbw`, comparable across rank
//!   counts;
//! * `wrong` counts elements that differ from a naive reduction.
//!
//! Bandwidths are in GB/s = 10⁹ bytes per second. The data are `f32` with
//! small integer values, so every reduction order gives the exact same sum
//! and `wrong` is an exact comparison. The measured time is wall-clock (this
//! is a benchmark, not a pod system): each size runs once untimed (checked
//! for correctness), then up to [`MAX_ITERATIONS`] timed iterations within
//! about [`TIME_BUDGET_SECONDS`]; inputs are restored between iterations,
//! outside the timed region. `measured_seconds` is the mean.

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::memory::stream::StreamFloor;

use super::{
    CollectiveError, LinkModel, MultisliceShape, PassSummary, ReduceOp, TorusShape, Traffic,
    all_gather, all_reduce, all_to_all, broadcast, chunk_range, multislice_all_gather,
    multislice_all_reduce, multislice_all_to_all, multislice_reduce_scatter,
    multislice_shard_ranges, naive_reduce, reduce_scatter, torus_all_reduce, torus_all_to_all,
};

/// Timed iterations per size at most (nccl-tests' default `-n 20`).
pub const MAX_ITERATIONS: usize = 20;

/// Wall-clock budget per size for the timed iterations.
pub const TIME_BUDGET_SECONDS: f64 = 1.0;

/// A collective to benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BenchOp {
    /// [`all_reduce`] with `sum`.
    AllReduce,
    /// [`reduce_scatter`] with `sum`.
    ReduceScatter,
    /// [`all_gather`].
    AllGather,
    /// [`broadcast`] from rank 0.
    Broadcast,
    /// [`all_to_all`] (the buffer in one equal chunk per rank: a size
    /// that does not divide is rounded down to one that does).
    AllToAll,
}

impl BenchOp {
    /// Every operation.
    pub const ALL: [BenchOp; 5] = [
        BenchOp::AllReduce,
        BenchOp::ReduceScatter,
        BenchOp::AllGather,
        BenchOp::Broadcast,
        BenchOp::AllToAll,
    ];

    /// The name used in rows and on command lines (`all_reduce`, …), as in
    /// nccl-tests' `all_reduce_perf`.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::AllGather => "all_gather",
            BenchOp::Broadcast => "broadcast",
            BenchOp::AllToAll => "all_to_all",
        }
    }

    /// busbw / algbw for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::ReduceScatter | BenchOp::AllGather | BenchOp::AllToAll => (n - 1.0) / n,
            BenchOp::Broadcast => 1.0,
        }
    }
}

impl fmt::Display for BenchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An operation name that is not one of [`BenchOp::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown collective {0:?}: expected all_reduce, reduce_scatter, all_gather, broadcast or \
     all_to_all{near}",
    near = crate::error::did_you_mean(.0, BenchOp::ALL.map(BenchOp::name))
)]
pub struct UnknownBenchOp(pub String);

impl FromStr for BenchOp {
    type Err = UnknownBenchOp;

    /// Accepts the row names and their dashed forms (`all-reduce`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key = s.trim().to_ascii_lowercase().replace('-', "_");
        BenchOp::ALL
            .into_iter()
            .find(|op| op.name() == key)
            .ok_or_else(|| UnknownBenchOp(s.to_owned()))
    }
}

/// One size of a benchmark run, serialized with exactly the keys `op`,
/// `bytes`, `measured_seconds`, `algbw_gbps`, `busbw_gbps`, `wrong`,
/// `modeled_seconds`, `modeled_busbw_gbps`, `floor_seconds`,
/// `ratio_to_floor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// [`BenchOp::name`].
    pub op: String,
    /// Buffer size per rank, bytes (a whole number of `f32`).
    pub bytes: u64,
    /// Mean wall-clock time of one call on this CPU.
    pub measured_seconds: f64,
    /// `bytes / measured_seconds`, GB/s (0 when nothing was timed).
    pub algbw_gbps: f64,
    /// `algbw · bus factor`, GB/s.
    pub busbw_gbps: f64,
    /// Elements that differ from the naive reference.
    pub wrong: u64,
    /// [`Traffic::modeled_seconds`] on the given link model.
    pub modeled_seconds: f64,
    /// Bus bandwidth implied by the modeled time, GB/s (0 when it is 0).
    pub modeled_busbw_gbps: f64,
    /// The shared-memory floor: [`floor_bytes`], the least any in-process
    /// implementation must move, at the machine's best streaming rate over
    /// the ranks' buffers with every core, measured in the same run
    /// ([`crate::memory::stream`]).
    pub floor_seconds: f64,
    /// `measured_seconds / floor_seconds` (1 would be at the floor).
    pub ratio_to_floor: f64,
    /// On a multislice pod, every pass (ICI axes and the DCN pass) with its
    /// bytes and modeled span; empty (and not serialized) otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passes: Vec<PassSummary>,
}

/// Runs `op` over a ring of `n_ranks` for every size in `sizes_bytes` (per
/// rank, rounded down to whole `f32` elements) and reports one row per size.
///
/// Each size allocates its inputs and working buffers, `2 × n_ranks × size`
/// bytes, plus one reference buffer; the ring's traffic, modeled on
/// `model`, gives the modeled columns. Collectives run in place (nccl-tests'
/// in-place columns).
pub fn run_nccl_style(
    op: BenchOp,
    n_ranks: usize,
    sizes_bytes: &[usize],
    model: LinkModel,
) -> Result<Vec<BenchRow>, CollectiveError> {
    if n_ranks == 0 {
        return Err(CollectiveError::NoRanks);
    }
    sizes_bytes
        .iter()
        .map(|&size| run_one(op, Layout::Ring(n_ranks), size / 4, &|_, _| model))
        .collect()
}

/// Deterministic inputs with small integer values: sums of up to 2²⁴/16
/// ranks are exact in `f32` whatever the order.
pub fn bench_inputs(n_ranks: usize, len: usize) -> Vec<Vec<f32>> {
    (0..n_ranks)
        .map(|r| {
            (0..len)
                .map(|i| ((r * 7 + i * 13) % 31) as f32 - 15.0)
                .collect()
        })
        .collect()
}

/// Runs the collective once on `buffers`.
pub fn run_op(
    op: BenchOp,
    buffers: &mut [Vec<f32>],
    ring: &[usize],
) -> Result<Traffic, CollectiveError> {
    match op {
        BenchOp::AllReduce => all_reduce(buffers, ring, ReduceOp::Sum),
        BenchOp::ReduceScatter => reduce_scatter(buffers, ring, ReduceOp::Sum),
        BenchOp::AllGather => all_gather(buffers, ring),
        BenchOp::Broadcast => broadcast(buffers, ring, ring[0]),
        BenchOp::AllToAll => all_to_all(buffers, ring),
    }
}

/// Elements of the ring members' `outputs` that differ from what `op` must
/// produce on `inputs` over `ring` (position `i` owns chunk `i`; the
/// broadcast root is `ring[0]`).
pub fn count_wrong(op: BenchOp, inputs: &[Vec<f32>], outputs: &[Vec<f32>], ring: &[usize]) -> u64 {
    let n = ring.len();
    let len = inputs.first().map_or(0, Vec::len);
    let differing = |expected: &[f32], got: &[f32]| -> u64 {
        expected.iter().zip(got).filter(|(a, b)| a != b).count() as u64
    };
    let members: Vec<&[f32]> = ring.iter().map(|&r| inputs[r].as_slice()).collect();
    match op {
        BenchOp::AllReduce => {
            let expected = naive_reduce(&members, ReduceOp::Sum);
            ring.iter()
                .map(|&r| differing(&expected, &outputs[r]))
                .sum()
        }
        BenchOp::ReduceScatter => {
            let expected = naive_reduce(&members, ReduceOp::Sum);
            ring.iter()
                .enumerate()
                .map(|(pos, &r)| {
                    let range = chunk_range(len, n, pos);
                    differing(&expected[range.clone()], &outputs[r][range])
                })
                .sum()
        }
        BenchOp::AllGather => {
            let expected: Vec<f32> = (0..n)
                .flat_map(|pos| members[pos][chunk_range(len, n, pos)].iter().copied())
                .collect();
            ring.iter()
                .map(|&r| differing(&expected, &outputs[r]))
                .sum()
        }
        BenchOp::Broadcast => match members.first() {
            Some(root) => ring.iter().map(|&r| differing(root, &outputs[r])).sum(),
            None => 0,
        },
        BenchOp::AllToAll => {
            // Position i's chunk j is position j's chunk i.
            let chunk = len.checked_div(n).unwrap_or(0);
            ring.iter()
                .enumerate()
                .map(|(i, &r)| {
                    (0..n)
                        .map(|j| {
                            let at = j * chunk..(j + 1) * chunk;
                            differing(&members[j][i * chunk..(i + 1) * chunk], &outputs[r][at])
                        })
                        .sum::<u64>()
                })
                .sum()
        }
    }
}

/// Where a benchmark runs: a flat ring of ranks `0..n`, every device of a
/// torus, or every device of a multislice pod.
#[derive(Debug, Clone, Copy)]
enum Layout<'a> {
    Ring(usize),
    Torus(&'a TorusShape),
    Multislice(&'a MultisliceShape),
}

impl Layout<'_> {
    fn ranks(&self) -> usize {
        match self {
            Layout::Ring(n) => *n,
            Layout::Torus(shape) => shape.device_count(),
            Layout::Multislice(shape) => shape.device_count(),
        }
    }

    /// The ring order used for everything except a torus all-reduce.
    fn ring(&self) -> Vec<usize> {
        match self {
            Layout::Ring(n) => (0..*n).collect(),
            Layout::Torus(shape) => shape.snake_ring(),
            Layout::Multislice(shape) => (0..shape.device_count()).collect(),
        }
    }

    fn run(
        &self,
        op: BenchOp,
        buffers: &mut [Vec<f32>],
        ring: &[usize],
    ) -> Result<Traffic, CollectiveError> {
        match (self, op) {
            (Layout::Torus(shape), BenchOp::AllReduce) => {
                torus_all_reduce(buffers, shape, ReduceOp::Sum)
            }
            (Layout::Torus(shape), BenchOp::AllToAll) => torus_all_to_all(buffers, shape),
            (Layout::Multislice(shape), BenchOp::AllToAll) => multislice_all_to_all(buffers, shape),
            (Layout::Torus(shape), _) => run_op(op, buffers, ring).map(|t| t.routed_on(shape)),
            (Layout::Ring(_), _) => run_op(op, buffers, ring),
            (Layout::Multislice(shape), BenchOp::AllReduce) => {
                multislice_all_reduce(buffers, shape, ReduceOp::Sum)
            }
            (Layout::Multislice(shape), BenchOp::ReduceScatter) => {
                multislice_reduce_scatter(buffers, shape, ReduceOp::Sum)
            }
            (Layout::Multislice(shape), BenchOp::AllGather) => {
                multislice_all_gather(buffers, shape)
            }
            (Layout::Multislice(shape), BenchOp::Broadcast) => Err(CollectiveError::AcrossSlices {
                pod: "this pod".into(),
                slices: shape.slices() as u32,
                what: "a broadcast".into(),
            }),
        }
    }

    fn count_wrong(
        &self,
        op: BenchOp,
        inputs: &[Vec<f32>],
        outputs: &[Vec<f32>],
        ring: &[usize],
    ) -> u64 {
        match (self, op) {
            // Every device in id order, as the torus and pod exchanges run.
            (_, BenchOp::AllToAll) => {
                let ids: Vec<usize> = (0..self.ranks()).collect();
                count_wrong(op, inputs, outputs, &ids)
            }
            (Layout::Multislice(shape), _) => count_wrong_multislice(op, shape, inputs, outputs),
            _ => count_wrong(op, inputs, outputs, ring),
        }
    }
}

/// [`run_nccl_style`] over every device of a torus: all-reduce runs the
/// torus algorithm ([`torus_all_reduce`]); reduce-scatter, all-gather and
/// broadcast run on [`TorusShape::snake_ring`], their traffic routed on the
/// torus ([`Traffic::routed_on`]). The bus factors use the device count.
pub fn run_nccl_style_torus(
    op: BenchOp,
    shape: &TorusShape,
    sizes_bytes: &[usize],
    model: LinkModel,
) -> Result<Vec<BenchRow>, CollectiveError> {
    sizes_bytes
        .iter()
        .map(|&size| run_one(op, Layout::Torus(shape), size / 4, &|_, _| model))
        .collect()
}

/// [`run_nccl_style`] over every device of a multislice pod, hierarchically
/// ([`super::multislice`]): all-reduce, reduce-scatter and all-gather (a
/// broadcast across slices is refused). `link` gives the model of each
/// directed hop (ICI inside a slice, the fabric's rails across); each row
/// lists its passes, the DCN pass among them. The bus factors use the
/// device count.
pub fn run_nccl_style_multislice(
    op: BenchOp,
    shape: &MultisliceShape,
    sizes_bytes: &[usize],
    link: &dyn Fn(usize, usize) -> LinkModel,
) -> Result<Vec<BenchRow>, CollectiveError> {
    if op == BenchOp::Broadcast {
        return Err(CollectiveError::AcrossSlices {
            pod: "this pod".into(),
            slices: shape.slices() as u32,
            what: "a broadcast".into(),
        });
    }
    sizes_bytes
        .iter()
        .map(|&size| run_one(op, Layout::Multislice(shape), size / 4, link))
        .collect()
}

/// Elements of `outputs` that differ from what the hierarchical `op` must
/// produce on `inputs` (every device's range of
/// [`multislice_shard_ranges`] for reduce-scatter and all-gather).
pub fn count_wrong_multislice(
    op: BenchOp,
    shape: &MultisliceShape,
    inputs: &[Vec<f32>],
    outputs: &[Vec<f32>],
) -> u64 {
    let len = inputs.first().map_or(0, Vec::len);
    let members: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let ranges = multislice_shard_ranges(shape, len);
    let differing = |expected: &[f32], got: &[f32]| -> u64 {
        expected.iter().zip(got).filter(|(a, b)| a != b).count() as u64
    };
    match op {
        BenchOp::AllReduce => {
            let expected = naive_reduce(&members, ReduceOp::Sum);
            outputs.iter().map(|o| differing(&expected, o)).sum()
        }
        BenchOp::ReduceScatter => {
            let expected = naive_reduce(&members, ReduceOp::Sum);
            ranges
                .iter()
                .zip(outputs)
                .map(|(r, o)| differing(&expected[r.clone()], &o[r.clone()]))
                .sum()
        }
        BenchOp::AllGather => {
            let mut expected = vec![0f32; len];
            for (r, input) in ranges.iter().zip(inputs) {
                expected[r.clone()].copy_from_slice(&input[r.clone()]);
            }
            outputs.iter().map(|o| differing(&expected, o)).sum()
        }
        BenchOp::Broadcast => outputs.len() as u64 * len as u64,
        BenchOp::AllToAll => {
            let ids: Vec<usize> = (0..inputs.len()).collect();
            count_wrong(op, inputs, outputs, &ids)
        }
    }
}

fn run_one(
    op: BenchOp,
    layout: Layout<'_>,
    len: usize,
    link: &dyn Fn(usize, usize) -> LinkModel,
) -> Result<BenchRow, CollectiveError> {
    let n = layout.ranks();
    let ring = layout.ring();
    let len = match op {
        BenchOp::AllToAll => len - len % n.max(1),
        _ => len,
    };
    let inputs = bench_inputs(n, len);
    let mut buffers = inputs.clone();
    let warm_start = Instant::now();
    let traffic = layout.run(op, &mut buffers, &ring)?;
    let warm = warm_start.elapsed().as_secs_f64();
    let wrong = layout.count_wrong(op, &inputs, &buffers, &ring);

    let iterations = if warm > 0.0 {
        ((TIME_BUDGET_SECONDS / warm).ceil() as usize).clamp(1, MAX_ITERATIONS)
    } else {
        MAX_ITERATIONS
    };
    let floor_before = measure_floor(n, len);
    let mut total = 0.0;
    for _ in 0..iterations {
        reset(&mut buffers, &inputs);
        let start = Instant::now();
        layout.run(op, &mut buffers, &ring)?;
        total += start.elapsed().as_secs_f64();
    }
    let measured_seconds = total / iterations as f64;
    let floor_seconds = measure_floor(n, len)
        .best_of(&floor_before)
        .seconds(floor_bytes(op, n, len));
    let bytes = (len * 4) as u64;
    let gbps = |seconds: f64| {
        if seconds > 0.0 {
            bytes as f64 / seconds / 1e9
        } else {
            0.0
        }
    };
    let factor = op.bus_factor(n);
    let algbw_gbps = gbps(measured_seconds);
    let modeled_seconds = traffic.modeled_seconds_by_link(link);
    let passes = match layout {
        Layout::Multislice(_) => traffic.passes(link),
        _ => Vec::new(),
    };
    Ok(BenchRow {
        op: op.name().to_owned(),
        bytes,
        measured_seconds,
        algbw_gbps,
        busbw_gbps: algbw_gbps * factor,
        wrong,
        modeled_seconds,
        modeled_busbw_gbps: gbps(modeled_seconds) * factor,
        floor_seconds,
        ratio_to_floor: if floor_seconds > 0.0 {
            measured_seconds / floor_seconds
        } else {
            0.0
        },
        passes,
    })
}

/// Streaming passes the floor is the best of, per kernel and thread count.
const FLOOR_REPS: usize = 10;

/// The least bytes any in-process `op` over `n` ranks of `len` `f32` must
/// move: all-reduce reads and writes every buffer (`2nB`), reduce-scatter
/// reads every buffer and writes each rank's chunk (`(n+1)B`), all-gather
/// reads each chunk and writes every buffer (`(n+1)B`), broadcast reads
/// the root's and writes the others' (`nB`), all-to-all reads and writes
/// every chunk but each rank's own (`2(n−1)B`).
pub fn floor_bytes(op: BenchOp, n: usize, len: usize) -> u64 {
    let per_buffer = match op {
        BenchOp::AllReduce => 2 * n,
        BenchOp::ReduceScatter | BenchOp::AllGather => n + 1,
        BenchOp::Broadcast => n,
        BenchOp::AllToAll => 2 * n.saturating_sub(1),
    };
    (per_buffer * len * 4) as u64
}

/// The machine's streaming floor over the ranks' buffers (`n` × `len`
/// `f32`), measured now ([`crate::memory::stream::measure_stream_floor`]);
/// empty (no rate, so a floor of 0) for empty buffers.
fn measure_floor(n: usize, len: usize) -> StreamFloor {
    let footprint = (n * len * 4) as u64;
    if footprint == 0 {
        return StreamFloor {
            footprint_bytes: 0,
            rates: Vec::new(),
        };
    }
    crate::memory::stream::measure_stream_floor(footprint, FLOOR_REPS)
}

/// Copies every rank's input into its buffer, ranks and pieces in
/// parallel: each byte of every buffer read once and written once.
fn reset(buffers: &mut [Vec<f32>], inputs: &[Vec<f32>]) {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 16;
    buffers
        .par_iter_mut()
        .zip(inputs.par_iter())
        .for_each(|(buffer, input)| {
            buffer
                .par_chunks_mut(PIECE)
                .zip(input.par_chunks(PIECE))
                .for_each(|(d, s)| d.copy_from_slice(s));
        });
}

/// Rows rendered as an nccl-tests table: sizes in bytes and elements, times
/// in microseconds, bandwidths in GB/s.
pub struct BenchTable<'a>(pub &'a [BenchRow]);

impl fmt::Display for BenchTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "#{:>13}{:>14}{:>8}{:>16}{:>11}{:>8}{:>8}{:>8}{:>13}{:>13}{:>11}{:>9}",
            "size",
            "count",
            "type",
            "op",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "model_time",
            "model_busbw",
            "floor",
            "x_floor"
        )?;
        writeln!(
            f,
            "#{:>13}{:>14}{:>8}{:>16}{:>11}{:>8}{:>8}{:>8}{:>13}{:>13}{:>11}{:>9}",
            "(B)",
            "(elements)",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(us)",
            ""
        )?;
        for row in self.0 {
            writeln!(
                f,
                " {:>13}{:>14}{:>8}{:>16}{:>11.1}{:>8.2}{:>8.2}{:>8}{:>13.1}{:>13.2}{:>11.1}{:>9.2}",
                row.bytes,
                row.bytes / 4,
                "float",
                row.op,
                row.measured_seconds * 1e6,
                row.algbw_gbps,
                row.busbw_gbps,
                row.wrong,
                row.modeled_seconds * 1e6,
                row.modeled_busbw_gbps,
                row.floor_seconds * 1e6,
                row.ratio_to_floor,
            )?;
        }
        let (sum, count) = self
            .0
            .iter()
            .fold((0.0, 0usize), |(s, c), r| (s + r.busbw_gbps, c + 1));
        if count > 0 {
            writeln!(f, "# Avg bus bandwidth    : {:.3} GB/s", sum / count as f64)?;
        }
        Ok(())
    }
}
