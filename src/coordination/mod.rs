//! Pod coordination: placement of work over devices.

pub mod load_balance;
