//! Clock offset estimation between devices.

pub mod pod;
pub mod protocols;
