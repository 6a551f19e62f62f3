//! The all-reduce of a pod split over MPI ranks, beside OpenMPI's own
//! `MPI_Allreduce` (`benches/mpi_allreduce.c`) on the same bytes, and the
//! shared-memory floor: every rank copying its buffer once, all at once.
//!
//! ```sh
//! cargo bench --features mpi --bench ranked_allreduce --no-run
//! mpirun -n 2 target/release/deps/ranked_allreduce-* [BYTES [ROUNDS]]
//! ```
//!
//! (`benches/ranked_allreduce.sh` builds both programs and runs them in
//! alternating rounds.) Two layouts:
//!
//! * `ring of ranks`: one member per rank, a ring reduce-scatter then
//!   all-gather over them — the setting of `MPI_Allreduce` across the
//!   ranks;
//! * `v4-16 torus`: the 8 devices of a v4-16 over its 2 hosts' ranks, every
//!   device a `BYTES` buffer (so `8/RANKS · BYTES` per rank), the torus's
//!   order: each rank's 2×2 block folded once in place, the z pass across
//!   ranks, then the block's copies.
//!
//! Each layout runs twice: over messages (`RankedGrid`: nonblocking
//! `MPI_Isend`/`MPI_Irecv` between the members' own buffers, the data
//! plane of ranks on several nodes), and through the ranks' MPI-3 shared
//! window (`SharedGrid::all_reduce_in_place`: every member's buffer a
//! region of its rank's part, each owner folding the others' chunks where
//! they lie and each member copying the owners' results straight from
//! them — how the split train step holds its gradients on one node). The
//! ring also runs `staged`: the members' buffers in the caller's memory,
//! copied into the window and back inside the timed round.
//!
//! Each round restores every member's input, then a barrier, then the
//! collective; a round's time is the slowest rank's. busbw = 2(n−1)/n ·
//! BYTES / time for n members.
//!
//! Every round's result is checked, as nccl-tests' `#wrong` column does:
//! every member's buffer must hold, bit for bit, the reduction one process
//! computes in the canonical order ([`ReduceGrid::reduce_for`] over each
//! owner's range). `wrong` counts the elements that differ, over all
//! rounds and ranks; any wrong element makes the run exit with status 1.

#[cfg(feature = "mpi")]
fn main() {
    bench::main();
}

#[cfg(not(feature = "mpi"))]
fn main() {
    eprintln!("ranked_allreduce needs the `mpi` feature: cargo bench --features mpi");
}

#[cfg(feature = "mpi")]
mod bench {
    use optirs_tpu::collectives::ranked::{
        RankedGrid, SharedGrid, grid_shard_ranges, member_regions,
    };
    use optirs_tpu::collectives::{ReduceGrid, ReduceOp};
    use optirs_tpu::topology::{DeviceId, load_preset};
    use optirs_tpu::transport::cluster::{self, Mailbox, RankContext, RankLayout, SharedMailbox};
    use optirs_tpu::transport::mpi::MpiMailbox;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// Every rank waits for every other (a gather to rank 0 and its answer).
    fn barrier(ctx: &RankContext) {
        let _ = cluster::gather_parts(&ctx.mailbox, &ctx.layout, Vec::new(), ctx.timeout)
            .expect("barrier");
        cluster::finish(&ctx.mailbox, &ctx.layout, Ok(()), ctx.timeout).expect("barrier");
    }

    /// The slowest rank's value, on rank 0 (others get their own).
    fn slowest(ctx: &RankContext, seconds: f64) -> f64 {
        let parts = cluster::gather_parts(
            &ctx.mailbox,
            &ctx.layout,
            seconds.to_le_bytes().to_vec(),
            ctx.timeout,
        )
        .expect("gather");
        cluster::finish(&ctx.mailbox, &ctx.layout, Ok(()), ctx.timeout).expect("gather");
        parts.map_or(seconds, |parts| {
            parts
                .iter()
                .map(|p| f64::from_le_bytes(p[..8].try_into().expect("eight bytes")))
                .fold(0.0, f64::max)
        })
    }

    fn median(mut v: Vec<f64>) -> (f64, f64) {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0])
    }

    /// Member `member`'s input: values of mixed magnitude, so a fold in
    /// another order shows in the bits.
    fn value(member: usize, i: usize) -> f32 {
        let x = ((member * 7919 + i * 104_729) % 1000) as f32;
        (x - 500.0) * 10f32.powi(((member + i) % 7) as i32 - 3)
    }

    /// The all-reduce one process computes: every owner's range of the
    /// reduce-scatter, reduced in the canonical order.
    fn expected(grid: &ReduceGrid, elements: usize) -> Vec<f32> {
        let mut whole = vec![0f32; elements];
        for (owner, range) in grid_shard_ranges(grid.dims(), elements)
            .into_iter()
            .enumerate()
        {
            let start = range.start;
            let mut fill = |member: usize, offset: usize, out: &mut [f32]| {
                for (j, v) in out.iter_mut().enumerate() {
                    *v = value(member, start + offset + j);
                }
            };
            grid.reduce_for(owner, ReduceOp::Sum, &mut whole[range], &mut fill);
        }
        whole
    }

    /// Each grid position's input on this rank (`None` where another rank
    /// holds the member).
    fn local_inputs(
        ctx: &RankContext,
        grid: &ReduceGrid,
        rank_of: &[u32],
        elements: usize,
    ) -> Vec<Option<Vec<f32>>> {
        let me = ctx.layout.rank();
        rank_of
            .iter()
            .enumerate()
            .map(|(pos, &r)| {
                (r == me).then(|| {
                    let member = grid.members()[pos];
                    (0..elements).map(|i| value(member, i)).collect()
                })
            })
            .collect()
    }

    /// The elements of `got` whose bits differ from `want`'s.
    fn wrong_elements(got: &[f32], want: &[f32]) -> u64 {
        got.iter()
            .zip(want)
            .filter(|(got, want)| got.to_bits() != want.to_bits())
            .count() as u64
    }

    /// One layout's rounds: (median, min) of the slowest rank's seconds,
    /// and the wrong elements over every round and rank.
    fn rounds(
        ctx: &RankContext,
        grid: &ReduceGrid,
        rank_of: &[u32],
        elements: usize,
        rounds: usize,
    ) -> ((f64, f64), u64) {
        let inputs = local_inputs(ctx, grid, rank_of, elements);
        let want = expected(grid, elements);
        let mut buffers = inputs.clone();
        let mut times = Vec::with_capacity(rounds);
        let mut wrong = 0u64;
        for round in 0..rounds + 3 {
            for (buffer, input) in buffers.iter_mut().zip(&inputs) {
                if let (Some(buffer), Some(input)) = (buffer, input) {
                    buffer.copy_from_slice(input);
                }
            }
            let mut local: Vec<Option<&mut [f32]>> = buffers
                .iter_mut()
                .map(|b| b.as_mut().map(|v| v.as_mut_slice()))
                .collect();
            barrier(ctx);
            let started = Instant::now();
            let mut ranked = RankedGrid {
                grid,
                rank_of,
                local: &mut local,
                tag: round as u64,
                window: None,
            };
            ranked
                .reduce_scatter(ctx, ReduceOp::Sum)
                .expect("reduce-scatter");
            ranked.all_gather(ctx).expect("all-gather");
            let t = slowest(ctx, started.elapsed().as_secs_f64());
            for buffer in buffers.iter().flatten() {
                wrong += wrong_elements(buffer, &want);
            }
            if round >= 3 {
                times.push(t);
            }
        }
        (median(times), total(ctx, wrong))
    }

    /// Where the members' buffers are in the window rounds: in the ranks'
    /// shared segment already (as the split train step keeps its
    /// gradients), or in the caller's memory, copied into the segment and
    /// back within the timed round.
    #[derive(Clone, Copy, PartialEq)]
    enum Residence {
        Segment,
        Staged,
    }

    /// [`rounds`] through the ranks' shared segment
    /// ([`SharedGrid::all_reduce_in_place`]): each member's buffer a
    /// region of its rank's part.
    fn rounds_shared(
        ctx: &RankContext,
        grid: &ReduceGrid,
        rank_of: &[u32],
        elements: usize,
        rounds: usize,
        residence: Residence,
    ) -> ((f64, f64), u64) {
        let me = ctx.layout.rank();
        let n = grid.len();
        let (slot, most) = member_regions(rank_of, ctx.layout.ranks());
        let inputs = local_inputs(ctx, grid, rank_of, elements);
        let want = expected(grid, elements);
        let mut caller = inputs.clone();
        let mut times = Vec::with_capacity(rounds);
        let mut wrong = 0u64;
        ctx.with_shared_segment(most * elements * 4, |segment| {
            let base: Vec<*mut f32> = (0..n)
                .map(|p| {
                    let part = segment.part(rank_of[p]).expect("a part per rank");
                    // SAFETY: `most` regions of `elements` fit in a part.
                    unsafe { part.cast::<f32>().add(slot[p] * elements) }
                })
                .collect();
            // SAFETY (every block below): this rank's members' regions of
            // its part, touched only between the collective's calls, which
            // fence before their first access and after their last.
            let region = |p: usize| unsafe { std::slice::from_raw_parts_mut(base[p], elements) };
            let shared = SharedGrid {
                grid,
                rank_of,
                base: &base,
                len: elements,
            };
            for round in 0..rounds + 3 {
                for (p, input) in inputs.iter().enumerate() {
                    if let Some(input) = input {
                        match residence {
                            Residence::Segment => region(p).copy_from_slice(input),
                            Residence::Staged => caller[p]
                                .as_mut()
                                .expect("held here")
                                .copy_from_slice(input),
                        }
                    }
                }
                barrier(ctx);
                let started = Instant::now();
                if residence == Residence::Staged {
                    for (p, held) in caller.iter().enumerate() {
                        if let Some(held) = held {
                            region(p).copy_from_slice(held);
                        }
                    }
                }
                unsafe { shared.all_reduce_in_place(ctx, segment, ReduceOp::Sum) }?;
                if residence == Residence::Staged {
                    for (p, held) in caller.iter_mut().enumerate() {
                        if let Some(held) = held {
                            held.copy_from_slice(region(p));
                        }
                    }
                }
                let t = slowest(ctx, started.elapsed().as_secs_f64());
                for p in (0..n).filter(|&p| rank_of[p] == me) {
                    let got: &[f32] = match residence {
                        Residence::Segment => region(p),
                        Residence::Staged => caller[p].as_deref().expect("held here"),
                    };
                    wrong += wrong_elements(got, &want);
                }
                if round >= 3 {
                    times.push(t);
                }
            }
            Ok(())
        })
        .expect("the shared all-reduce")
        .expect("ranks on one node share memory");
        (median(times), total(ctx, wrong))
    }

    /// The sum of every rank's `count`, on rank 0 (others get their own).
    fn total(ctx: &RankContext, count: u64) -> u64 {
        let parts = cluster::gather_parts(
            &ctx.mailbox,
            &ctx.layout,
            count.to_le_bytes().to_vec(),
            ctx.timeout,
        )
        .expect("gather");
        cluster::finish(&ctx.mailbox, &ctx.layout, Ok(()), ctx.timeout).expect("gather");
        parts.map_or(count, |parts| {
            parts
                .iter()
                .map(|p| u64::from_le_bytes(p[..8].try_into().expect("eight bytes")))
                .sum()
        })
    }

    /// The floor: every rank copies its buffer once (read and write every
    /// byte), all ranks at once.
    fn floor(ctx: &RankContext, elements: usize, rounds: usize) -> (f64, f64) {
        let src = vec![0.5f32; elements];
        let mut dst = vec![0f32; elements];
        let mut times = Vec::with_capacity(rounds);
        for round in 0..rounds + 3 {
            barrier(ctx);
            let started = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            let t = slowest(ctx, started.elapsed().as_secs_f64());
            if round >= 3 {
                times.push(t);
            }
        }
        median(times)
    }

    pub fn main() {
        let args: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect();
        let bytes: usize = args
            .first()
            .and_then(|a| a.parse().ok())
            .unwrap_or(16 << 20);
        let count: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20);
        let (mailbox, session) = MpiMailbox::initialize().expect("MPI starts once");
        let ranks = mailbox.ranks();
        let topology = load_preset("v4-16").expect("a preset");
        let layout = RankLayout::new(&topology, ranks, mailbox.rank()).expect("at most 2 ranks");
        let mailbox: SharedMailbox = Arc::new(Mutex::new(Box::new(mailbox)));
        let ctx = RankContext {
            layout,
            mailbox,
            timeout: Duration::from_secs(60),
            buffers: Default::default(),
            segment: Default::default(),
        };
        let elements = bytes / 4;
        // Whole f32 elements: the bytes reported are the bytes reduced.
        let bytes = elements * 4;
        let members: Vec<usize> = (0..ranks as usize).collect();
        let ring = ReduceGrid::ring(&members);
        let ring_ranks: Vec<u32> = (0..ranks).collect();
        let (ring_time, ring_wrong) = rounds(&ctx, &ring, &ring_ranks, elements, count);
        let torus = ReduceGrid::torus(&[2, 2, 2]);
        let torus_ranks: Vec<u32> = (0..8)
            .map(|d| ctx.layout.rank_of_device(DeviceId(d)))
            .collect();
        let (torus_time, torus_wrong) = rounds(&ctx, &torus, &torus_ranks, elements, count);
        let shared = |grid: &ReduceGrid, ranks: &[u32], residence: Residence| {
            rounds_shared(&ctx, grid, ranks, elements, count, residence)
        };
        let ring_window = shared(&ring, &ring_ranks, Residence::Segment);
        let ring_staged = shared(&ring, &ring_ranks, Residence::Staged);
        let torus_window = shared(&torus, &torus_ranks, Residence::Segment);
        let floor_time = floor(&ctx, elements, count);
        let results = [
            ("ring of ranks", ranks as usize, ring_time, ring_wrong),
            ("v4-16 torus", 8, torus_time, torus_wrong),
            (
                "ring of ranks, window",
                ranks as usize,
                ring_window.0,
                ring_window.1,
            ),
            (
                "ring of ranks, window, staged",
                ranks as usize,
                ring_staged.0,
                ring_staged.1,
            ),
            ("v4-16 torus, window", 8, torus_window.0, torus_window.1),
        ];
        let wrong: u64 = results.iter().map(|r| r.3).sum();
        if ctx.layout.runs_service() {
            let busbw = |n: usize, t: f64| 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64 / t;
            for (layout, n, (median, min), wrong) in results {
                println!(
                    "{{\"layout\":\"{layout}\",\"ranks\":{ranks},\"members\":{n},\"bytes\":{bytes},\
                     \"rounds\":{count},\"median_seconds\":{median:.9},\"min_seconds\":{min:.9},\
                     \"busbw_bytes_per_s\":{:.1},\"floor_seconds\":{:.9},\"ratio_to_floor\":{:.3},\
                     \"wrong\":{wrong}}}",
                    busbw(n, median),
                    floor_time.0,
                    median / floor_time.0
                );
            }
        }
        drop(ctx);
        drop(session);
        if wrong > 0 {
            eprintln!("ranked_allreduce: {wrong} elements differ from the one-process reduction");
            std::process::exit(1);
        }
    }
}
