//! Pod-level coordination services: the typed [`TPUPodCoordinator`] (over
//! [`crate::coordination::PodCoordinator`]) and clock synchronization.

pub mod synchronization;
pub mod tpu_pod_coordinator;

pub use tpu_pod_coordinator::{PodCoordinationConfig, TPUPodCoordinator};
