//! Clock offset estimation between devices.

pub mod protocols;
