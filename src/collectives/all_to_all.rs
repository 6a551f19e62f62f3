//! All-to-all: every member sends a distinct chunk to every other member
//! (`jax.lax.all_to_all`, `MPI_Alltoall`), and its ragged form with a count
//! per destination (`ragged_all_to_all`, `MPI_Alltoallv`) — the exchange a
//! mixture-of-experts layer makes twice a pass, tokens to their experts and
//! back.
//!
//! **Data.** A buffer of `len` elements splits into one chunk per member
//! ([`super::chunk_range`], equal: `len` must divide by the member count); after
//! the exchange member `i`'s chunk `j` is member `j`'s chunk `i` (a
//! transpose of the members × chunks matrix). Nothing is combined, so every
//! element arrives with its bits.
//!
//! **Schedule and traffic.** A ring's members relay: each chunk leaves its
//! source toward its destination the shorter way round (the forward way on
//! a tie, or on a line without wraparound the only way), one link a step,
//! and at each step every directed link carries one message, the chunks
//! then crossing it (store-and-forward, so the alpha-beta model's one
//! message per link and step holds exactly). On a bidirectional ring of `n`
//! the busiest link carries `Σ_{d=1}^{⌊n/2⌋} d` chunks over `⌊n/2⌋` steps,
//! about `n/8` of a buffer: a quarter of what an all-gather of the same
//! buffer puts on it, as the JAX scaling book has it. On a torus the
//! exchange runs one axis after another (axis 0, then 1, then 2), each a
//! ring all-to-all on every line of that axis at once carrying
//! `1/extent` of each buffer per pair; across slices the last pass is one
//! exchange over the DCN fabric's rails, every host to its twin in every
//! other slice at once (module [`super::multislice`]).

use std::collections::BTreeMap;

use super::CollectiveError;
use super::multislice::{MultisliceShape, record_exchange};
use super::ring_slices;
use super::torus::TorusShape;
use super::traffic::{Phase, PhaseKind, Traffic, Transfer};

/// All-to-all over the ring's members, in place: member `i`'s chunk `j`
/// becomes member `j`'s chunk `i` (module docs). The traffic is the relay
/// schedule on the ring's neighbours (bidirectional; route it on a torus
/// with [`Traffic::routed_on`] when the members are not neighbours).
///
/// ```
/// use optirs_tpu::collectives::all_to_all;
/// let mut buffers = vec![vec![0i32, 1, 2], vec![10, 11, 12], vec![20, 21, 22]];
/// let traffic = all_to_all(&mut buffers, &[0, 1, 2])?;
/// assert_eq!(buffers, [[0, 10, 20], [1, 11, 21], [2, 12, 22]]);
/// // Each of the 6 chunks crosses one link (3 members: every pair adjacent).
/// assert_eq!(traffic.total_bytes(), 6 * 4);
/// # Ok::<(), optirs_tpu::collectives::CollectiveError>(())
/// ```
pub fn all_to_all<T: Copy + Send, B: AsMut<[T]>>(
    buffers: &mut [B],
    ring: &[usize],
) -> Result<Traffic, CollectiveError> {
    let len = transpose_in_place(buffers, ring)?;
    let chunk = len / ring.len();
    let bytes = (chunk * std::mem::size_of::<T>()) as u64;
    Ok(relay_traffic(ring, true, &|_, _| bytes, 0, 0))
}

/// Ragged all-to-all: member `i` (ring position) sends
/// `send_counts[i][j]` elements to member `j`, its input the concatenation
/// of those segments in member order; each member's output is the
/// concatenation of what it receives, in member order (its own segment in
/// its place). Returns the outputs and the relay schedule's traffic.
///
/// ```
/// use optirs_tpu::collectives::ragged_all_to_all;
/// let inputs = vec![vec![1.0f32, 2.0, 3.0], vec![4.0]];
/// // Member 0 keeps 1.0 and sends 2.0, 3.0; member 1 sends 4.0.
/// let (outputs, traffic) = ragged_all_to_all(&inputs, &[0, 1], &[vec![1, 2], vec![1, 0]])?;
/// assert_eq!(outputs, [vec![1.0, 4.0], vec![2.0, 3.0]]);
/// assert_eq!(traffic.total_bytes(), 3 * 4);
/// # Ok::<(), optirs_tpu::collectives::CollectiveError>(())
/// ```
pub fn ragged_all_to_all<T: Copy>(
    inputs: &[Vec<T>],
    ring: &[usize],
    send_counts: &[Vec<usize>],
) -> Result<(Vec<Vec<T>>, Traffic), CollectiveError> {
    let n = ring.len();
    if n == 0 {
        return Err(CollectiveError::EmptyRing);
    }
    let mut seen = vec![false; inputs.len()];
    for &rank in ring {
        let slot = seen.get_mut(rank).ok_or(CollectiveError::RankOutOfRange {
            rank,
            buffers: inputs.len(),
        })?;
        if std::mem::replace(slot, true) {
            return Err(CollectiveError::DuplicateRank { rank });
        }
    }
    if send_counts.len() != n {
        return Err(CollectiveError::RaggedCounts {
            member: send_counts.len().min(n),
            reason: format!("{} rows of counts for {n} members", send_counts.len()),
        });
    }
    for (i, (&rank, counts)) in ring.iter().zip(send_counts).enumerate() {
        let total: usize = counts.iter().sum();
        if counts.len() != n || total != inputs[rank].len() {
            return Err(CollectiveError::RaggedCounts {
                member: i,
                reason: format!(
                    "{} counts summing to {total} for {n} members and a buffer of {}",
                    counts.len(),
                    inputs[rank].len()
                ),
            });
        }
    }
    let offsets: Vec<Vec<usize>> = send_counts
        .iter()
        .map(|counts| {
            counts
                .iter()
                .scan(0, |at, &c| {
                    let start = *at;
                    *at += c;
                    Some(start)
                })
                .collect()
        })
        .collect();
    let outputs = (0..n)
        .map(|j| {
            let mut out = Vec::with_capacity((0..n).map(|i| send_counts[i][j]).sum());
            for i in 0..n {
                let start = offsets[i][j];
                out.extend_from_slice(&inputs[ring[i]][start..start + send_counts[i][j]]);
            }
            out
        })
        .collect();
    let elem = std::mem::size_of::<T>() as u64;
    let traffic = relay_traffic(ring, true, &|i, j| send_counts[i][j] as u64 * elem, 0, 0);
    Ok((outputs, traffic))
}

/// All-to-all over every device of a torus, in place (chunk `j` of device
/// `i` to device `j`'s chunk `i`, device ids as [`TorusShape::index`]);
/// traffic: axis after axis, each a relay on every line of the axis.
pub fn torus_all_to_all<T: Copy + Send, B: AsMut<[T]>>(
    buffers: &mut [B],
    shape: &TorusShape,
) -> Result<Traffic, CollectiveError> {
    let ring: Vec<usize> = (0..shape.device_count()).collect();
    check_count(buffers.len(), shape.device_count())?;
    let len = transpose_in_place(buffers, &ring)?;
    Ok(torus_all_to_all_traffic(
        shape,
        len,
        std::mem::size_of::<T>(),
    ))
}

/// The traffic of [`torus_all_to_all`] for buffers of `len` elements of
/// `elem_bytes` each (`len` dividing by the device count).
pub fn torus_all_to_all_traffic(shape: &TorusShape, len: usize, elem_bytes: usize) -> Traffic {
    let count = shape.device_count().max(1);
    ici_passes(shape, count, ((len / count) * elem_bytes) as u64)
}

/// A torus all-to-all's passes when every device holds `chunks` chunks of
/// `chunk_bytes` throughout: per axis of extent `e`, each pair on a line
/// exchanges the `chunks/e` bound for the other's coordinate.
fn ici_passes(shape: &TorusShape, chunks: usize, chunk_bytes: u64) -> Traffic {
    let mut traffic = Traffic::default();
    for (axis, &extent) in shape.dims().iter().enumerate() {
        if extent < 2 {
            continue;
        }
        let bytes = (chunks / extent) as u64 * chunk_bytes;
        let wrap = shape.wraparound()[axis];
        for line in lines(shape, axis) {
            let part = relay_traffic(&line, wrap, &|_, _| bytes, axis as u32, axis as u32);
            traffic.transfers.extend(part.transfers);
        }
    }
    traffic.transfers.sort_by_key(|t| t.phase);
    traffic
}

/// All-to-all over every device of a multislice pod (device
/// `local + chips·slice`), in place: the slices' axes over ICI, then one
/// exchange across the slices over the DCN fabric's rails.
pub fn multislice_all_to_all<T: Copy + Send, B: AsMut<[T]>>(
    buffers: &mut [B],
    shape: &MultisliceShape,
) -> Result<Traffic, CollectiveError> {
    check_count(buffers.len(), shape.device_count())?;
    let ring: Vec<usize> = (0..shape.device_count()).collect();
    let len = transpose_in_place(buffers, &ring)?;
    Ok(multislice_all_to_all_traffic(
        shape,
        len,
        std::mem::size_of::<T>(),
    ))
}

/// The traffic of [`multislice_all_to_all`]: inside every slice the
/// torus schedule over the pod's whole chunk count, then per host and
/// destination slice one DCN transfer carrying every chip of the host's
/// chunks bound there.
pub fn multislice_all_to_all_traffic(
    shape: &MultisliceShape,
    len: usize,
    elem_bytes: usize,
) -> Traffic {
    let count = shape.device_count().max(1);
    let chips = shape.chips_per_slice();
    let slices = shape.slices();
    let mut traffic = Traffic::default();
    // Inside a slice each device holds `count` chunks throughout; per
    // axis it exchanges count/extent of them with each line neighbour,
    // what a slice-sized all-to-all of the whole buffer does.
    let chunk_bytes = ((len / count) * elem_bytes) as u64;
    let slice_traffic = ici_passes(shape.slice(), count, chunk_bytes);
    for s in 0..slices {
        traffic
            .transfers
            .extend(slice_traffic.transfers.iter().map(|t| Transfer {
                src: t.src + s * chips,
                dst: t.dst + s * chips,
                ..*t
            }));
    }
    // Each device's whole buffer splits into one part per slice, part
    // `k` (its chips' chunks bound there) to its twin in slice `k`.
    let order = shape.slice().dims().len() as u32;
    let whole = vec![0..len; count];
    record_exchange(
        &mut traffic,
        shape,
        &whole,
        PhaseKind::AllToAll,
        order,
        elem_bytes,
    );
    traffic.transfers.sort_by_key(|t| t.phase);
    traffic
}

/// The members × chunks transpose over `ring`'s buffers; their length.
/// Every pair `(i, j)` swaps member `i`'s chunk `j` with member `j`'s chunk
/// `i` (disjoint slices, so the pairs run in parallel with rayon): each
/// element is read and written once, the floor of a copy.
fn transpose_in_place<T: Copy + Send, B: AsMut<[T]>>(
    buffers: &mut [B],
    ring: &[usize],
) -> Result<usize, CollectiveError> {
    use rayon::prelude::*;
    let slices = ring_slices(buffers, ring)?;
    let n = ring.len();
    let len = slices[0].len();
    check_divides(len, n)?;
    let chunk = len / n;
    if chunk == 0 {
        return Ok(len);
    }
    let mut grid: Vec<Vec<Option<&mut [T]>>> = slices
        .into_iter()
        .map(|s| s.chunks_mut(chunk).map(Some).collect())
        .collect();
    // Pair (i, j), i < j: the upper triangle's chunks with the lower's.
    let mut lower: Vec<Vec<&mut [T]>> = (0..n).map(|_| Vec::new()).collect();
    let mut upper: Vec<&mut [T]> = Vec::with_capacity(n * (n - 1) / 2);
    for (i, row) in grid.iter_mut().enumerate() {
        for (j, cell) in row.iter_mut().enumerate() {
            let slice = cell.take().expect("each chunk taken once");
            match j.cmp(&i) {
                std::cmp::Ordering::Greater => upper.push(slice),
                std::cmp::Ordering::Less => lower[j].push(slice),
                std::cmp::Ordering::Equal => {}
            }
        }
    }
    // upper is (i, j) in row order; lower[i] holds (j, i) for j > i in
    // the same order.
    let pairs: Vec<(&mut [T], &mut [T])> =
        upper.into_iter().zip(lower.into_iter().flatten()).collect();
    pairs
        .into_par_iter()
        .for_each(|(a, b)| a.swap_with_slice(b));
    Ok(len)
}

fn check_divides(len: usize, members: usize) -> Result<(), CollectiveError> {
    if !len.is_multiple_of(members) {
        return Err(CollectiveError::Indivisible { len, members });
    }
    Ok(())
}

fn check_count(got: usize, expected: usize) -> Result<(), CollectiveError> {
    if got != expected {
        return Err(CollectiveError::BufferCount { expected, got });
    }
    Ok(())
}

/// The device ids of every line of `shape` along `axis`, each in
/// coordinate order.
fn lines(shape: &TorusShape, axis: usize) -> Vec<Vec<usize>> {
    let extent = shape.dims()[axis];
    (0..shape.device_count())
        .filter(|&d| shape.coords(d)[axis] == 0)
        .map(|start| {
            let mut coords = shape.coords(start);
            (0..extent)
                .map(|c| {
                    coords[axis] = c;
                    shape.index(&coords).expect("in range")
                })
                .collect()
        })
        .collect()
}

/// The relay schedule of an all-to-all over `members` (ring order;
/// `wrap`: the last and the first are neighbours): the chunk from position
/// `i` to `j` (`bytes(i, j)`, 0 for none) goes the shorter way, forward on
/// a tie, one link a step; each directed link's chunks of a step are one
/// transfer.
fn relay_traffic(
    members: &[usize],
    wrap: bool,
    bytes: &dyn Fn(usize, usize) -> u64,
    order: u32,
    dim: u32,
) -> Traffic {
    let n = members.len();
    // (step, from position, forward) → bytes.
    let mut load: BTreeMap<(usize, usize, bool), u64> = BTreeMap::new();
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            let b = bytes(i, j);
            if b == 0 {
                continue;
            }
            let ahead = (j + n - i) % n;
            let forward = if wrap { ahead <= n - ahead } else { j > i };
            let distance = if wrap {
                ahead.min(n - ahead)
            } else {
                i.abs_diff(j)
            };
            for step in 0..distance {
                let at = if forward {
                    (i + step) % n
                } else {
                    (i + n - step) % n
                };
                *load.entry((step, at, forward)).or_insert(0) += b;
            }
        }
    }
    let transfers = load
        .into_iter()
        .map(|((step, at, forward), bytes)| {
            let next = if forward {
                (at + 1) % n
            } else {
                (at + n - 1) % n
            };
            Transfer {
                src: members[at],
                dst: members[next],
                bytes,
                hops: 1,
                phase: Phase {
                    order,
                    kind: PhaseKind::AllToAll,
                    dim,
                    step: step as u32,
                },
            }
        })
        .collect();
    Traffic { transfers }
}

/// The relay schedule's alpha-beta time on a ring of `n` members with
/// `chunk_bytes` per pair: bidirectional (`wrap`), the forward way takes
/// the distances `1..=⌊n/2⌋` and at step `s` each of its links carries
/// `⌊n/2⌋ − s` chunks, so `⌊n/2⌋·α + (⌊n/2⌋(⌊n/2⌋+1)/2)·c/β`; on a line
/// the middle link carries `n − 1 − s` chunks at step `s` of `n − 1`:
/// `(n−1)·α + (n(n−1)/2)·c/β`.
pub fn ring_all_to_all_seconds(
    n: usize,
    wrap: bool,
    chunk_bytes: u64,
    model: &super::LinkModel,
) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let (steps, chunks) = if wrap {
        let f = n / 2;
        (f, f * (f + 1) / 2)
    } else {
        (n - 1, n * (n - 1) / 2)
    };
    steps as f64 * model.latency_seconds()
        + chunks as f64 * chunk_bytes as f64 / model.bandwidth_bytes_per_second()
}

/// [`torus_all_to_all`]'s time for buffers of `len` elements of
/// `elem_bytes`: its axes one after another, each a ring all-to-all with
/// `count/extent` chunks per pair ([`ring_all_to_all_seconds`]).
pub fn torus_all_to_all_seconds(
    shape: &TorusShape,
    len: usize,
    elem_bytes: usize,
    model: &super::LinkModel,
) -> f64 {
    let count = shape.device_count().max(1);
    let chunk = ((len / count) * elem_bytes) as u64;
    shape
        .dims()
        .iter()
        .zip(shape.wraparound())
        .map(|(&extent, &wrap)| {
            ring_all_to_all_seconds(extent, wrap, (count / extent.max(1)) as u64 * chunk, model)
        })
        .sum()
}
