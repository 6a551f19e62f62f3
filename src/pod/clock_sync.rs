//! The pod's clock-synchronization calls, over [`crate::clock_sync`].

use super::Pod;
use crate::clock_sync::{self, OffsetEstimate};
use crate::error::Result;
use crate::topology::DeviceId;

impl Pod {
    /// Sets a device's clock offset (ns at time zero, signed: a device
    /// clock may run behind) and drift (ppm). The device is a [`DeviceId`]
    /// or its bare number.
    pub fn set_device_clock(
        &mut self,
        device: impl Into<DeviceId>,
        offset_ns: i64,
        drift_ppm: f64,
    ) -> Result<()> {
        let entity = self.device_entity(device)?;
        clock_sync::set_device_clock(self.world_mut(), entity, offset_ns, drift_ppm);
        Ok(())
    }

    /// The device's current estimate of the service clock minus its own.
    pub fn clock_estimate(&self, device: impl Into<DeviceId>) -> Option<OffsetEstimate> {
        let entity = self.device_entity(device).ok()?;
        clock_sync::clock_estimate(self.world(), entity)
    }
}
