//! Clock synchronization: RFC 5905's four-timestamp exchange and clock
//! filter ([`protocols`]), and the per-device clocks that run it between the
//! pod's devices and the coordination service in simulated time
//! ([`systems`]: [`DeviceClock`], [`ClockSync`], installed in
//! [`crate::schedule::StepSystems::ClockSync`], right after the heartbeats).

pub mod protocols;
pub mod systems;

pub use protocols::{ClockError, NtpSynchronizer, OffsetEstimate, SimulatedClock};
pub use systems::{ClockSync, DeviceClock, clock_estimate, install, set_device_clock};
