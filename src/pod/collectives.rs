//! The pod's collectives, over [`crate::collectives::pod`]: each call
//! moves the real data at once, charges the links and starts a collective
//! entity; the blocking forms step the pod until it completes, like a host
//! waiting on a collective, and return an error naming the device when a
//! participant fails or dies before the completion time (the buffers are
//! then undefined).

use super::Pod;
use crate::collectives::pod::{
    CollectiveKind, CollectiveReport, launch_all_reduce, launch_multislice, launch_ring,
    multislice_of, poll_collective, torus_of,
};
use crate::collectives::{
    CollectiveError, Element, MultisliceShape, ReduceOp, TorusShape, Traffic, all_gather,
    broadcast, reduce_scatter,
};
use crate::error::Result;

impl Pod {
    /// The pod's slice as a torus for the collectives.
    pub fn torus_shape(&self) -> Result<TorusShape> {
        Ok(torus_of(self.topology())?)
    }

    /// A multislice pod's shape for the hierarchical collectives.
    pub fn multislice_shape(&self) -> Result<MultisliceShape> {
        Ok(multislice_of(self.topology())?)
    }

    /// Hierarchical reduce-scatter over every device of a multislice pod
    /// (ICI inside each slice, then DCN across), stepping the pod until it
    /// completes. Returns the report (its `passes` show the DCN pass) and
    /// each device's range: `buffers[d][ranges[d]]` holds the reduction of
    /// that range over every device.
    pub fn multislice_reduce_scatter<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<(CollectiveReport, Vec<std::ops::Range<usize>>)> {
        let (report, ranges) = launch_multislice(self.world_mut(), buffers, Some(op))?;
        self.wait_for_collective(&report)?;
        Ok((report, ranges))
    }

    /// Hierarchical all-gather over every device of a multislice pod (DCN
    /// across slices, then ICI inside each): device `d` contributes
    /// `buffers[d][ranges[d]]` (the ranges returned, those of
    /// [`Pod::multislice_reduce_scatter`]), and afterwards every device
    /// holds every range.
    pub fn multislice_all_gather<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
    ) -> Result<(CollectiveReport, Vec<std::ops::Range<usize>>)> {
        let (report, ranges) = launch_multislice(self.world_mut(), buffers, None)?;
        self.wait_for_collective(&report)?;
        Ok((report, ranges))
    }

    /// Steps until the collective completes; an error naming the device if
    /// a participant is declared failed first, or was killed before the
    /// completion time. Bounded: the collective is finished at its
    /// completion time ([`CollectiveReport::completes_at_ns`]), and a
    /// collective still pending a tick later is an error
    /// ([`CollectiveError::Stalled`]).
    pub fn wait_for_collective(&mut self, report: &CollectiveReport) -> Result<()> {
        while !poll_collective(self.world(), report)? {
            self.step();
        }
        Ok(())
    }

    /// Starts an all-reduce over every device (`buffers[i]` is device `i`'s;
    /// hierarchical on a multislice pod): the data is reduced now; the collective completes in simulated time,
    /// and the buffers hold its result only once it has (see
    /// [`Pod::wait_for_collective`]).
    pub fn launch_all_reduce<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<CollectiveReport> {
        Ok(launch_all_reduce(self.world_mut(), buffers, op)?)
    }

    /// All-reduce over every device, stepping the pod until it completes.
    pub fn all_reduce<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<CollectiveReport> {
        let report = self.launch_all_reduce(buffers, op)?;
        self.wait_for_collective(&report)?;
        Ok(report)
    }

    fn ring_collective<T: Element>(
        &mut self,
        kind: CollectiveKind,
        buffers: &mut [Vec<T>],
        run: impl FnOnce(&mut [Vec<T>], &[usize]) -> std::result::Result<Traffic, CollectiveError>,
    ) -> Result<CollectiveReport> {
        let report = launch_ring(self.world_mut(), kind, buffers, run)?;
        self.wait_for_collective(&report)?;
        Ok(report)
    }

    /// Reduce-scatter over every device along the snake ring. Chunks follow
    /// ring order, not device order: with `len` elements per buffer and `n`
    /// devices, the returned ring's position `i` (device `ring[i]`) holds
    /// the reduction of chunk `i`, `buffers[ring[i]][chunk_range(len, n, i)]`
    /// ([`crate::collectives::chunk_range`]); its other elements keep their
    /// input values. Returns the report and the ring.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<(CollectiveReport, Vec<usize>)> {
        let ring = self.torus_shape()?.snake_ring();
        let report = self.ring_collective(CollectiveKind::ReduceScatter, buffers, |b, r| {
            reduce_scatter(b, r, op)
        })?;
        Ok((report, ring))
    }

    /// All-gather over every device along the snake ring, in the same
    /// order as [`Pod::reduce_scatter`]: the returned ring's position `i`
    /// (device `ring[i]`) contributes chunk `i` of its buffer,
    /// `buffers[ring[i]][chunk_range(len, n, i)]`, and afterwards every
    /// device holds every chunk there (so an all-gather after a
    /// reduce-scatter completes an all-reduce). Returns the report and the
    /// ring.
    pub fn all_gather<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
    ) -> Result<(CollectiveReport, Vec<usize>)> {
        let ring = self.torus_shape()?.snake_ring();
        let report =
            self.ring_collective(CollectiveKind::AllGather, buffers, |b, r| all_gather(b, r))?;
        Ok((report, ring))
    }

    /// Broadcast device `root`'s buffer to every device.
    pub fn broadcast<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        root: u32,
    ) -> Result<CollectiveReport> {
        self.ring_collective(CollectiveKind::Broadcast, buffers, |b, r| {
            broadcast(b, r, root as usize)
        })
    }
}
