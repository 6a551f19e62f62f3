//! NTP between the pod's devices and the coordination service, in
//! simulated time.
//!
//! Every device has a [`DeviceClock`]: a [`SimulatedClock`] with an offset
//! and a drift (zero unless the host sets them), so tests know the truth.
//! Once per heartbeat interval, right after its heartbeat, each running
//! device runs one four-timestamp exchange with the coordination service,
//! whose clock is true time. The request and the reply each take the
//! control network's latency plus the device's control jitter, drawn
//! independently, so the path is asymmetric the way a real one is. The
//! device's [`ClockSync`] keeps RFC 5905's 8-sample minimum-delay filter;
//! its estimate is the service's clock minus the device's.

use super::protocols::{ExchangeDelays, NtpSynchronizer, OffsetEstimate, SimulatedClock, exchange};
use crate::clock::SimClock;
use crate::health::{ControlJitter, DeviceState, HeartbeatConfig};
use crate::rng::SimRng;
use crate::schedule::{Step, StepSystems};
use crate::topology::Device;
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
use serde::{Deserialize, Serialize};

/// A device's local clock (the truth the estimate is checked against).
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceClock(pub SimulatedClock);

/// A device's NTP association with the coordination service.
#[derive(Component, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockSync {
    /// The filter and its estimate.
    pub ntp: NtpSynchronizer,
    /// Next exchange, simulated ns.
    pub next_exchange_ns: u64,
}

/// Random-stream key for clock exchanges.
const CLOCK_STREAM: u64 = 4;

/// Each running device due for an exchange runs one.
pub fn synchronize_clocks(
    clock: Res<SimClock>,
    config: Res<HeartbeatConfig>,
    rng: Res<SimRng>,
    mut devices: Query<(
        &Device,
        &DeviceState,
        &ControlJitter,
        &DeviceClock,
        &mut ClockSync,
    )>,
) {
    let now = clock.now_ns;
    let service = SimulatedClock::default();
    for (device, state, jitter, local, mut sync) in &mut devices {
        if sync.next_exchange_ns > now {
            continue;
        }
        sync.next_exchange_ns = now + config.interval_ns;
        if !state.is_running() {
            continue;
        }
        let key = |leg: u64| [u64::from(device.id.0), now ^ (leg << 62)];
        let delays = ExchangeDelays {
            request_ns: (config.control_latency_ns
                + rng.up_to(jitter.jitter_ns, CLOCK_STREAM, key(1))) as i64,
            reply_ns: (config.control_latency_ns
                + rng.up_to(jitter.jitter_ns, CLOCK_STREAM, key(2))) as i64,
            turnaround_ns: 0,
        };
        // An exchange the timestamps cannot support is counted as rejected
        // by the synchronizer, like a bad packet.
        if let Ok(sample) = exchange(&local.0, &service, delays, now as i64) {
            sync.ntp.record_sample(sample);
        }
    }
}

/// Installs device clocks and [`synchronize_clocks`] (after heartbeats).
pub fn install(world: &mut World) {
    let devices: Vec<Entity> = world
        .query_filtered::<Entity, With<Device>>()
        .iter(world)
        .collect();
    for entity in devices {
        world
            .entity_mut(entity)
            .insert((DeviceClock::default(), ClockSync::default()));
    }
    world
        .resource_mut::<Schedules>()
        .add_systems(Step, synchronize_clocks.in_set(StepSystems::ClockSync));
}

/// Sets a device's clock offset (ns at time zero) and drift (ppm).
pub fn set_device_clock(world: &mut World, device: Entity, offset_ns: i64, drift_ppm: f64) {
    world.entity_mut(device).insert(DeviceClock(SimulatedClock {
        offset_ns,
        drift_ppm,
    }));
}

/// The device's current estimate of the service clock minus its own.
pub fn clock_estimate(world: &World, device: Entity) -> Option<OffsetEstimate> {
    world.get::<ClockSync>(device)?.ntp.estimate()
}

/// The earliest time [`synchronize_clocks`] changes the world: the next
/// exchange due (a silent device's schedule moves on too).
pub fn next_event(world: &mut World) -> crate::clock::NextEvent {
    let mut syncs = world.query::<&ClockSync>();
    crate::clock::NextEvent::at(syncs.iter(world).map(|s| s.next_exchange_ns).min())
}
