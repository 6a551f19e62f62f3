//! Clock offset estimation between devices: the seed's path to
//! [`crate::clock_sync`].

/// The per-device clocks and their systems ([`crate::clock_sync::systems`]).
pub mod pod {
    pub use crate::clock_sync::systems::*;
}

/// RFC 5905's exchange and clock filter ([`crate::clock_sync::protocols`]).
pub mod protocols {
    pub use crate::clock_sync::protocols::*;
}
