//! Why a goodput simulation was refused. Every input is checked before any
//! simulation runs, so an error means no work was done.

use thiserror::Error;

/// A goodput input that cannot be simulated.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum GoodputError {
    /// An input that must be a positive, finite number is not.
    #[error("{name} must be a positive number, got {value}{hint}")]
    NotPositive {
        /// The input's name as the user gave it (`--mtbf-hours`).
        name: &'static str,
        /// What was given.
        value: f64,
        /// What the input means, to say what to give instead.
        hint: &'static str,
    },
    /// An input that must be zero or more (a time) is negative or not finite.
    #[error("{name} must be zero or a positive number of seconds, got {value}")]
    Negative {
        /// The input's name.
        name: &'static str,
        /// What was given.
        value: f64,
    },
    /// The model has no parameters: there is nothing to train or checkpoint.
    #[error("--model-params is 0; a model has at least one parameter (e.g. 405e9)")]
    NoParameters,
    /// The pod has no chips or hosts to fail.
    #[error("the pod has no {what}; goodput needs at least one chip on one host")]
    EmptyFleet {
        /// `chips` or `hosts`.
        what: &'static str,
    },
    /// A recovery policy name that is not known.
    #[error("unknown recovery policy `{name}` (known: rollback, redundant, spare-cube){note}")]
    UnknownRecovery {
        /// What was given.
        name: String,
        /// Why a policy the issue tracker names is not available, if it is one.
        note: &'static str,
    },
    /// `--recovery spare-cube` on a pod with no spare cubes.
    #[error(
        "--recovery spare-cube needs spare cubes, and {pod} has none: give a v4 or v5p pod \
         file `cubes: (spares: N)`, or use rollback or redundant"
    )]
    NoSpareCube {
        /// The pod.
        pod: String,
    },
    /// A failure unit name that is not known.
    #[error("unknown failure unit `{name}` (known: chip, host)")]
    UnknownFailureUnit {
        /// What was given.
        name: String,
    },
    /// A checkpoint interval that is neither a number of seconds nor `auto`.
    #[error("--checkpoint-every `{text}` is not a positive number of seconds, `auto` or `never`")]
    BadInterval {
        /// What was given.
        text: String,
    },
    /// The run would draw more failures than a simulation should hold.
    #[error(
        "{days} days at one failure every {system_mtbf_seconds:.3} s is about {expected:.0} \
         failures, more than the {limit} a run simulates; give a longer --mtbf-hours or fewer --days"
    )]
    TooManyFailures {
        /// Simulated days.
        days: f64,
        /// Mean time between failures of the whole pod, seconds.
        system_mtbf_seconds: f64,
        /// Expected failures in the run.
        expected: f64,
        /// The limit.
        limit: u64,
    },
    /// The run holds more steps than a simulation counts.
    #[error(
        "{days} days of {step_seconds} s steps is more than the {limit} steps a run counts; \
         give a longer --step-seconds or fewer --days"
    )]
    TooManySteps {
        /// Simulated days.
        days: f64,
        /// The step's length, seconds.
        step_seconds: f64,
        /// The limit.
        limit: u64,
    },
    /// The run is shorter than one training step.
    #[error("{days} days is shorter than one {step_seconds} s step; simulate at least one step")]
    ShorterThanAStep {
        /// Simulated days.
        days: f64,
        /// The step's length, seconds.
        step_seconds: f64,
    },
    /// The pod's step could not be modeled (the closed-form sharded step).
    #[error("cannot model the step on this pod: {reason}; give --step-seconds")]
    Step {
        /// Why.
        reason: String,
    },
}
