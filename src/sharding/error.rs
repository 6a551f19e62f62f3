//! Why a sharded model could not be built, stepped or re-sharded.

use thiserror::Error;

use crate::collectives::CollectiveError;
use crate::exec::runtime::ExecError;
use crate::health::FaultError;
use crate::memory::MemoryError;
use crate::topology::DeviceId;

use super::timing::StepPhase;

/// What made a step fail while it was in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureCause {
    /// The device was killed.
    DeviceKilled(DeviceId),
    /// The device stopped (paused) and did not do its part.
    DevicePaused(DeviceId),
    /// The failure detector declared the device failed.
    DeviceFailed(DeviceId),
    /// The link between two devices was cut.
    LinkCut {
        /// One end.
        src: DeviceId,
        /// The other end.
        dst: DeviceId,
    },
    /// The compiled update itself failed (an engine fault: its programs
    /// and arguments are checked at launch).
    UpdateFailed(UpdateError),
}

/// Why the compiled update failed, kept whole and shared: a cause is
/// cloned into every error that reports the step. Two are equal when they
/// are the same failure.
#[derive(Debug, Clone, Error)]
#[error("{0}")]
pub struct UpdateError(#[source] pub std::sync::Arc<ShardingError>);

impl PartialEq for UpdateError {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for UpdateError {}

/// A name the command line or a config gave that names nothing known.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown {what} `{name}` (known: {known}){}", crate::error::did_you_mean(name, known.split(", ")))]
pub struct UnknownName {
    /// What was named (`reduction`).
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The names that work, comma-separated.
    pub known: &'static str,
}

impl std::fmt::Display for FailureCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailureCause::DeviceKilled(d) => write!(f, "{d} was killed"),
            FailureCause::DevicePaused(d) => write!(f, "{d} stopped (paused)"),
            FailureCause::DeviceFailed(d) => write!(f, "{d} was declared failed"),
            FailureCause::LinkCut { src, dst } => write!(f, "the link {src} - {dst} was cut"),
            FailureCause::UpdateFailed(m) => write!(f, "the update failed: {m}"),
        }
    }
}

impl FailureCause {
    /// The device that failed, if a device did.
    pub fn device(&self) -> Option<DeviceId> {
        match *self {
            FailureCause::DeviceKilled(d)
            | FailureCause::DevicePaused(d)
            | FailureCause::DeviceFailed(d) => Some(d),
            FailureCause::LinkCut { .. } | FailureCause::UpdateFailed(_) => None,
        }
    }
}

/// A sharded-model operation failed; nothing changed (a failed step leaves
/// parameters, state and count as they were).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ShardingError {
    /// A strategy a real run does not have on this pod yet.
    #[error(
        "the {strategy} strategy on {place} runs modeled only for now; use the replicated \
         strategy for a real run, or the closed-form model"
    )]
    ModeledOnly {
        /// The strategy asked for.
        strategy: super::mesh::Strategy,
        /// Where (`a multislice pod (NAME has S slices)`).
        place: String,
    },
    /// A mesh that does not lay out on the pod (the axis and the pod's
    /// shape named).
    #[error(transparent)]
    Mesh(#[from] super::mesh::MeshError),
    /// A mesh a real run does not build on this pod yet.
    #[error("the mesh {mesh} runs modeled only for now: {reason}")]
    MeshNotBuilt {
        /// The mesh (`data=2,fsdp=4,tensor=1`).
        mesh: String,
        /// What is not built.
        reason: String,
    },
    /// A parameter set with no tensors.
    #[error("the model has no tensors; add at least one parameter tensor")]
    EmptyModel,
    /// Two tensors with one name.
    #[error("the model has two tensors named `{name}`; tensor names must be unique")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A tensor with no elements.
    #[error(
        "tensor `{name}` has shape {shape:?}, with no elements; every tensor needs at least one"
    )]
    EmptyTensor {
        /// The name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A model too large to index.
    #[error("the model has more elements than this machine can address ({elements})")]
    TooLarge {
        /// The element count (saturated).
        elements: u128,
    },
    /// A model past what the closed-form step models
    /// ([`super::bucket_runs::MAX_MODELED_ELEMENTS`]).
    #[error(
        "the model has {elements} elements; the closed-form step models at most {max} (2^60), \
         so that every byte count of a device stays within 64 bits"
    )]
    TooLargeToModel {
        /// The element count (saturated).
        elements: u128,
        /// The limit.
        max: u64,
    },
    /// An fsdp prefetch past [`super::residency::MAX_PREFETCH`].
    #[error(
        "prefetch {prefetch}: an fsdp step gathers at most {max} buckets ahead of the one in use"
    )]
    Prefetch {
        /// What was asked.
        prefetch: usize,
        /// The limit.
        max: usize,
    },
    /// A bucket size of zero or below one element.
    #[error("bucket_bytes = {bytes} holds no {dtype} element; use at least {min} bytes")]
    BucketBytes {
        /// What was asked.
        bytes: usize,
        /// The element type.
        dtype: String,
        /// The smallest that works.
        min: usize,
    },
    /// Gradients for the wrong number of replicas.
    #[error(
        "the step got gradients for {got} replicas, but the model runs {expected} (one per device)"
    )]
    ReplicaCount {
        /// Replicas of the model.
        expected: usize,
        /// Gradient sets given.
        got: usize,
    },
    /// A replica's gradients do not match the model's tensors.
    #[error("replica {replica}'s gradients: {reason}")]
    GradientMismatch {
        /// Which replica.
        replica: usize,
        /// What is wrong (names the tensor and both shapes).
        reason: String,
    },
    /// A step asked of an optimizer with no compiled update rule.
    #[error(
        "`{optimizer}` has no element-wise update rule the compiler can shard; the sharded \
         step runs the seven built-in optimizers (sgd, momentum, nesterov, adagrad, rmsprop, \
         adam, adamw)"
    )]
    NoUpdateRule {
        /// The optimizer.
        optimizer: String,
    },
    /// A participant cannot take part, so the step was not launched.
    #[error("step {step} cannot start: {cause}; exclude the device (or recover) first")]
    Unavailable {
        /// The step.
        step: u64,
        /// What is wrong.
        cause: FailureCause,
    },
    /// Another step is still in flight.
    #[error("step {step} is still in flight; wait for it before launching another")]
    StepInFlight {
        /// The step in flight.
        step: u64,
    },
    /// No model in the world.
    #[error("the pod holds no sharded model")]
    NoModel,
    /// The device list does not make the pod's torus.
    #[error("{reason}")]
    Devices {
        /// What is wrong.
        reason: String,
    },
    /// The step failed in flight: nothing changed.
    #[error(
        "step {step} failed during {phase} at {at_ns} ns: {cause}; no parameters or state changed"
    )]
    StepFailed {
        /// The step number (1-based).
        step: u64,
        /// The phase it was in.
        phase: StepPhase,
        /// Simulated time of the failure, ns.
        at_ns: u64,
        /// What failed.
        cause: FailureCause,
    },
    /// The step is still pending past its completion time (its systems are
    /// not in the schedule).
    #[error(
        "step {step} should have completed at {completes_at_ns} ns but is still pending at \
         {now_ns} ns: the sharded-step systems are not in the pod's schedule"
    )]
    Stalled {
        /// The step.
        step: u64,
        /// When it was due.
        completes_at_ns: u64,
        /// Now.
        now_ns: u64,
    },
    /// State that does not belong to the model's layout.
    #[error("the sharded state is inconsistent: {reason}")]
    InvalidState {
        /// What is wrong.
        reason: String,
    },
    /// The spare-cube policy was chosen for a pod with no spare cubes.
    #[error(
        "--recovery spare-cube needs spare cubes, and {pod} has none: give the pod file \
         `cubes: (spares: 1)` (v4, v5p and tpu7x pods of whole 4x4x4 cubes), or use rollback or \
         redundant"
    )]
    NoSpareCubes {
        /// The pod.
        pod: String,
    },
    /// A checkpoint directory holds another run's model.
    #[error(
        "{path} holds a checkpoint of another run: {theirs}; this run is {ours}. Use another \
         checkpoint directory (or remove that one)"
    )]
    OtherRun {
        /// The checkpoint.
        path: std::path::PathBuf,
        /// Its model and pod.
        theirs: String,
        /// This run's.
        ours: String,
    },
    /// Nothing to resume from.
    #[error("{root} holds no verified checkpoint to resume from{problems}")]
    NothingToResume {
        /// The directory.
        root: std::path::PathBuf,
        /// `: ` and why each checkpoint there does not verify, or empty.
        problems: String,
    },
    /// No policy could recover from a failure.
    #[error("recovery failed: {reason}")]
    Recovery {
        /// Why.
        reason: String,
    },
    /// The spare-cube policy could not swap the lost devices' cubes.
    #[error("recovery failed: {0}")]
    CubesRefused(#[source] FaultError),
    /// A step failed and the pod could not recover.
    #[error("step {step} failed ({cause}) and the pod cannot recover: {reason}")]
    Unrecoverable {
        /// The step.
        step: u64,
        /// What failed.
        cause: FailureCause,
        /// Why no policy helps.
        #[source]
        reason: RecoveryFailure,
    },
    /// A device was down at launch.
    #[error(transparent)]
    Fault(#[from] FaultError),
    /// The ranks of a split pod could not do the step together (a rank
    /// lost, or out of step).
    #[error(transparent)]
    Cluster(#[from] crate::transport::ClusterError),
    /// A link was missing or cut at launch.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A device's HBM could not hold its part.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The update program failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// A sharding error that only passes on another domain's error comes back
/// as that domain's (a link cut at launch is a `Collective` error, out of
/// HBM a `Memory` one).
impl From<ShardingError> for crate::error::OptimError {
    fn from(error: ShardingError) -> Self {
        use crate::error::{ErrorKind, OptimError};
        match error {
            ShardingError::Fault(e) => e.into(),
            ShardingError::Collective(e) => e.into(),
            ShardingError::Memory(e) => e.into(),
            ShardingError::Exec(e) => e.into(),
            ShardingError::Cluster(e) => e.into(),
            other => OptimError::new(ErrorKind::Sharding, other),
        }
    }
}

/// Why no recovery policy could recover a failed step
/// ([`ShardingError::Unrecoverable`], [`super::ShardedStep::recovery`]).
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum RecoveryFailure {
    /// Spare-cube recovery on a pod split over ranks.
    #[error(
        "{cause}; spare-cube recovery runs in one process (cube-built pods are not split over \
         ranks)"
    )]
    SpareCubeSplit {
        /// What failed the step.
        cause: FailureCause,
    },
    /// The step failed on a cut link with no device lost.
    #[error(
        "{cause}, and no device is lost: neither policy re-shards around it; restore the link \
         (or exclude a device) and step again"
    )]
    NoDeviceLost {
        /// What failed the step.
        cause: FailureCause,
    },
    /// The policy ran and failed (its error kept whole).
    #[error("{0}")]
    Failed(#[source] std::sync::Arc<ShardingError>),
}

impl From<ShardingError> for RecoveryFailure {
    fn from(error: ShardingError) -> Self {
        RecoveryFailure::Failed(std::sync::Arc::new(error))
    }
}
