//! Coordination: the [`PodCoordinator`] facade over a simulated
//! [`crate::Pod`], and placement of work over devices ([`load_balance`]).
//!
//! ```
//! use optirs_tpu::coordination::{PodConfig, PodCoordinator};
//!
//! let mut pod = PodCoordinator::new(PodConfig { num_devices: 8, ..Default::default() })?;
//! pod.synchronize_devices("step-0".to_string())?;       // a real barrier over 8 devices
//! pod.kill_device(3)?;
//! let error = pod.synchronize_devices("step-1".to_string()).unwrap_err();
//! assert!(error.to_string().contains("7/8 arrived"));
//! // Device 3 is declared failed now and left out: the pod synchronizes again.
//! pod.synchronize_devices("step-2".to_string())?;
//! assert_eq!(pod.participants().len(), 7);
//! # Ok::<(), optirs_tpu::coordination::CoordinationError>(())
//! ```

pub use crate::load_balance;
pub mod pod_coordinator;

pub use pod_coordinator::{CoordinationError, PodConfig, PodCoordinator};
