//! Which rank owns which hosts and devices.

use super::SERVICE_RANK;
use crate::topology::{DeviceId, Topology};
use crate::transport::error::ClusterError;
use bevy_ecs::prelude::*;

/// Which rank owns which hosts: contiguous blocks, sizes differing by at
/// most one (rank `r` owns hosts `r·H/R .. (r+1)·H/R`).
#[derive(Resource, Debug, Clone, PartialEq, Eq)]
pub struct RankLayout {
    ranks: u32,
    rank: u32,
    /// First host of each rank, and the host count at the end.
    host_starts: Vec<u32>,
    /// The host of each device id.
    device_hosts: Vec<u32>,
}

impl RankLayout {
    /// The layout of `topology` over `ranks` ranks, seen from `rank`.
    pub fn new(topology: &Topology, ranks: u32, rank: u32) -> Result<RankLayout, ClusterError> {
        let hosts = topology.num_hosts();
        if ranks == 0 || ranks > hosts {
            return Err(ClusterError::TooManyRanks { ranks, hosts });
        }
        if rank >= ranks {
            return Err(ClusterError::NoSuchRank { rank, ranks });
        }
        let host_starts = (0..=ranks)
            .map(|r| (u64::from(r) * u64::from(hosts) / u64::from(ranks)) as u32)
            .collect();
        let device_hosts = (0..topology.num_devices())
            .map(|d| topology.host_of(d))
            .collect();
        Ok(RankLayout {
            ranks,
            rank,
            host_starts,
            device_hosts,
        })
    }

    /// Ranks in the job.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Whether this rank runs the coordination service.
    pub fn runs_service(&self) -> bool {
        self.rank == SERVICE_RANK
    }

    /// The hosts `rank` owns.
    pub fn hosts(&self, rank: u32) -> std::ops::Range<u32> {
        let r = rank.min(self.ranks - 1) as usize;
        self.host_starts[r]..self.host_starts[r + 1]
    }

    /// `hosts 4..=7` of a rank, for errors.
    pub fn describe_hosts(&self, rank: u32) -> String {
        let hosts = self.hosts(rank);
        format!("{}..={}", hosts.start, hosts.end.saturating_sub(1))
    }

    /// The rank that owns host `host`.
    pub fn rank_of_host(&self, host: u32) -> u32 {
        (self.host_starts.partition_point(|&start| start <= host) as u32).saturating_sub(1)
    }

    /// The rank that owns device `device` (rank 0 for an unknown id).
    pub fn rank_of_device(&self, device: DeviceId) -> u32 {
        self.device_hosts
            .get(device.0 as usize)
            .map_or(SERVICE_RANK, |&h| self.rank_of_host(h))
    }

    /// The rank that delivers a message for `to` (`None`: the service).
    pub fn owner(&self, to: Option<DeviceId>) -> u32 {
        to.map_or(SERVICE_RANK, |d| self.rank_of_device(d))
    }

    /// Whether this rank runs `device`.
    pub fn is_local(&self, device: DeviceId) -> bool {
        self.rank_of_device(device) == self.rank
    }

    /// The device ids this rank runs, in order.
    pub fn local_devices(&self) -> Vec<DeviceId> {
        (0..self.device_hosts.len() as u32)
            .map(DeviceId)
            .filter(|&d| self.is_local(d))
            .collect()
    }
}
