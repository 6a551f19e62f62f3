//! Pod-level coordination services.

pub mod synchronization;
