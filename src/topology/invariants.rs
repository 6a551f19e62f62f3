//! [`Topology::check_invariants`]: the invariants every method of
//! [`Topology`] relies on, for a topology that did not come through
//! validation (one decoded from a snapshot).

use super::cubes::check_layout;
use super::model::{MAX_FABRIC_LINKS, MAX_POD_CHIPS, Topology};

impl Topology {
    /// Checks the invariants every method here relies on, for a topology
    /// that did not come through [`resolve`](super::resolve()) (one decoded
    /// from a snapshot, whose bytes may be forged with a matching digest):
    /// the problem, naming the field.
    pub fn check_invariants(&self) -> Result<(), String> {
        let chips = self.check_shape_invariants()?;
        self.check_host_invariants()?;
        self.check_timing_invariants()?;
        self.check_twist_invariants()?;
        self.check_fabric_invariants()?;
        if let Some(layout) = &self.cubes {
            check_layout(self, layout)?;
        }
        self.check_extra_link_ends(chips as u32)
    }

    /// Dimensions, slices and the chip bound; the pod's chip count.
    fn check_shape_invariants(&self) -> Result<u64, String> {
        let spec = self.generation.spec();
        if self.ndims != spec.torus_dims {
            return Err(format!(
                "ndims = {}, but a {} torus has {} dimensions",
                self.ndims, self.generation, spec.torus_dims
            ));
        }
        if let Some(axis) =
            (0..3).find(|&a| self.dims[a] == 0 || (a >= self.ndims && self.dims[a] != 1))
        {
            return Err(format!(
                "dims[{axis}] = {} is not a chip count of the shape",
                self.dims[axis]
            ));
        }
        if self.slices == 0 {
            return Err("slices = 0".into());
        }
        let chips = self.dims.iter().fold(u64::from(self.slices), |n, &d| {
            n.saturating_mul(u64::from(d))
        });
        if chips > MAX_POD_CHIPS {
            return Err(format!("{chips} chips, more than {MAX_POD_CHIPS}"));
        }
        Ok(chips)
    }

    /// The host block divides the slice; cores per chip in range.
    fn check_host_invariants(&self) -> Result<(), String> {
        if let Some(axis) = (0..3).find(|&a| {
            self.host_bounds[a] == 0 || !self.dims[a].is_multiple_of(self.host_bounds[a])
        }) {
            return Err(format!(
                "host_bounds[{axis}] = {} does not divide dims[{axis}] = {}",
                self.host_bounds[axis], self.dims[axis]
            ));
        }
        if !(1..=8).contains(&self.cores_per_chip) {
            return Err(format!(
                "cores_per_chip = {} is not between 1 and 8",
                self.cores_per_chip
            ));
        }
        Ok(())
    }

    /// A tick and an interval of at least 1 ns, the timeout after the interval.
    fn check_timing_invariants(&self) -> Result<(), String> {
        if self.tick_ns == 0 || self.heartbeat_interval_ns == 0 {
            return Err("tick_ns and heartbeat_interval_ns must be at least 1".into());
        }
        if self.heartbeat_timeout_ns <= self.heartbeat_interval_ns {
            return Err("heartbeat_timeout_ns is not after heartbeat_interval_ns".into());
        }
        Ok(())
    }

    /// Every twist moves an existing wraparound link along another axis.
    fn check_twist_invariants(&self) -> Result<(), String> {
        for axis in 0..3 {
            for other in 0..3 {
                let offset = self.twist[axis][other];
                if offset == 0 {
                    continue;
                }
                if other == axis || offset >= self.dims[other] {
                    return Err(format!(
                        "twist[{axis}][{other}] = {offset} is not a shift along another axis \
                         of the shape"
                    ));
                }
                if !(self.wraparound[axis] && self.dims[axis] >= 3) {
                    return Err(format!(
                        "twist[{axis}] moves a wraparound link that axis {axis} does not have"
                    ));
                }
            }
        }
        Ok(())
    }

    /// A fabric joins 2 or more slices with sane figures and few enough links.
    fn check_fabric_invariants(&self) -> Result<(), String> {
        let Some(fabric) = &self.dcn_fabric else {
            return Ok(());
        };
        let sane = fabric.host_bytes_per_s.is_finite()
            && fabric.host_bytes_per_s > 0.0
            && fabric.oversubscription.is_finite()
            && fabric.oversubscription >= 1.0;
        if self.slices < 2 || !sane {
            return Err(format!(
                "dcn_fabric {fabric:?} needs 2 or more slices, positive host bandwidth \
                 and an oversubscription of at least 1"
            ));
        }
        if self.fabric_link_count() > MAX_FABRIC_LINKS {
            return Err(format!(
                "the DCN fabric has {} links, more than {MAX_FABRIC_LINKS}",
                self.fabric_link_count()
            ));
        }
        Ok(())
    }

    /// Every explicit link joins two of the pod's `devices`.
    fn check_extra_link_ends(&self, devices: u32) -> Result<(), String> {
        if let Some(link) = self
            .extra_links
            .iter()
            .find(|l| l.a >= devices || l.b >= devices)
        {
            return Err(format!(
                "extra link {} -> {} leaves the pod's {devices} devices",
                link.a, link.b
            ));
        }
        Ok(())
    }
}
