//! [`Topology::check_invariants`]: the invariants every method of
//! [`Topology`] relies on, for a topology that did not come through
//! validation (one decoded from a snapshot).

use super::cubes::check_layout;
use super::error::InvariantError;
use super::model::{MAX_FABRIC_LINKS, MAX_POD_CHIPS, Topology};

impl Topology {
    /// Checks the invariants every method here relies on, for a topology
    /// that did not come through [`resolve`](super::resolve()) (one decoded
    /// from a snapshot, whose bytes may be forged with a matching digest):
    /// the problem, naming the field.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
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
    fn check_shape_invariants(&self) -> Result<u64, InvariantError> {
        let spec = self.generation.spec();
        if self.ndims != spec.torus_dims {
            return Err(InvariantError::DimensionCount {
                ndims: self.ndims,
                generation: self.generation,
                torus_dims: spec.torus_dims,
            });
        }
        if let Some(axis) =
            (0..3).find(|&a| self.dims[a] == 0 || (a >= self.ndims && self.dims[a] != 1))
        {
            return Err(InvariantError::Dimension {
                axis,
                size: self.dims[axis],
            });
        }
        if self.slices == 0 {
            return Err(InvariantError::NoSlices);
        }
        let chips = self.dims.iter().fold(u64::from(self.slices), |n, &d| {
            n.saturating_mul(u64::from(d))
        });
        if chips > MAX_POD_CHIPS {
            return Err(InvariantError::TooManyChips {
                chips,
                max: MAX_POD_CHIPS,
            });
        }
        Ok(chips)
    }

    /// The host block divides the slice; cores per chip in range.
    fn check_host_invariants(&self) -> Result<(), InvariantError> {
        if let Some(axis) = (0..3).find(|&a| {
            self.host_bounds[a] == 0 || !self.dims[a].is_multiple_of(self.host_bounds[a])
        }) {
            return Err(InvariantError::HostBlock {
                axis,
                bound: self.host_bounds[axis],
                size: self.dims[axis],
            });
        }
        if !(1..=8).contains(&self.cores_per_chip) {
            return Err(InvariantError::Cores(self.cores_per_chip));
        }
        Ok(())
    }

    /// A tick and an interval of at least 1 ns, the timeout after the interval.
    fn check_timing_invariants(&self) -> Result<(), InvariantError> {
        if self.tick_ns == 0 || self.heartbeat_interval_ns == 0 {
            return Err(InvariantError::ZeroTime);
        }
        if self.heartbeat_timeout_ns <= self.heartbeat_interval_ns {
            return Err(InvariantError::TimeoutNotAfterInterval);
        }
        Ok(())
    }

    /// Every twist moves an existing wraparound link along another axis.
    fn check_twist_invariants(&self) -> Result<(), InvariantError> {
        for axis in 0..3 {
            for other in 0..3 {
                let offset = self.twist[axis][other];
                if offset == 0 {
                    continue;
                }
                if other == axis || offset >= self.dims[other] {
                    return Err(InvariantError::TwistOffset {
                        axis,
                        other,
                        offset,
                    });
                }
                if !(self.wraparound[axis] && self.dims[axis] >= 3) {
                    return Err(InvariantError::TwistWithoutWraparound(axis));
                }
            }
        }
        Ok(())
    }

    /// A fabric joins 2 or more slices with sane figures and few enough links.
    fn check_fabric_invariants(&self) -> Result<(), InvariantError> {
        let Some(fabric) = &self.dcn_fabric else {
            return Ok(());
        };
        let sane = fabric.host_bytes_per_s.is_finite()
            && fabric.host_bytes_per_s > 0.0
            && fabric.oversubscription.is_finite()
            && fabric.oversubscription >= 1.0;
        if self.slices < 2 || !sane {
            return Err(InvariantError::FabricFigures(*fabric));
        }
        if self.fabric_link_count() > MAX_FABRIC_LINKS {
            return Err(InvariantError::TooManyFabricLinks {
                links: self.fabric_link_count(),
                max: MAX_FABRIC_LINKS,
            });
        }
        Ok(())
    }

    /// Every explicit link joins two of the pod's `devices`.
    fn check_extra_link_ends(&self, devices: u32) -> Result<(), InvariantError> {
        if let Some(link) = self
            .extra_links
            .iter()
            .find(|l| l.a >= devices || l.b >= devices)
        {
            return Err(InvariantError::ExtraLinkOutside {
                a: link.a,
                b: link.b,
                devices,
            });
        }
        Ok(())
    }
}
