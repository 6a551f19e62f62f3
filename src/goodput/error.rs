//! Why a goodput simulation was refused. Every input is checked before any
//! simulation runs, so an error means no work was done.

use std::sync::Arc;

use thiserror::Error;

use crate::collectives::CollectiveError;
use crate::sharding::ShardingError;

/// A number for a person, as the command line prints them: plain digits in
/// the usual range, scientific notation outside it (`1.8e19`, `2.2e-308`),
/// never `-0`, so a message never spells out hundreds of digits.
pub fn readable(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if !value.is_finite() {
        return value.to_string();
    }
    if (1e-3..1e9).contains(&value.abs()) {
        let text = format!("{value:.6}");
        return text.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    let text = format!("{value:.2e}");
    match text.split_once('e') {
        Some((mantissa, exponent)) => {
            let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
            format!("{mantissa}e{exponent}")
        }
        None => text,
    }
}

/// Why the sharded step could not be modeled: the sharding layer's error,
/// shared so a [`GoodputError`] stays cheap to clone and comparable. Its
/// message and source are the sharding error's; two are equal when they
/// are the same error ([`Arc::ptr_eq`]).
#[derive(Debug, Clone)]
pub struct StepModelError(pub Arc<ShardingError>);

impl StepModelError {
    /// The sharding layer's error.
    pub fn sharding_error(&self) -> &ShardingError {
        &self.0
    }
}

impl std::fmt::Display for StepModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for StepModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl PartialEq for StepModelError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A goodput input that cannot be simulated.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum GoodputError {
    /// An input that must be a positive, finite number is not.
    #[error("{name} must be a positive number, got {}{hint}", readable(*.value))]
    NotPositive {
        /// The input's name as the user gave it (`--mtbf-hours`).
        name: &'static str,
        /// What was given.
        value: f64,
        /// What the input means, to say what to give instead.
        hint: &'static str,
    },
    /// An input that must be zero or more (a time) is negative or not finite.
    #[error("{name} must be zero or a positive number of seconds, got {}", readable(*.value))]
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
    #[error(
        "unknown recovery policy `{name}` (known: rollback, redundant, spare-cube){note}{}",
        crate::error::did_you_mean(name, ["rollback", "redundant", "spare-cube"])
    )]
    UnknownRecovery {
        /// What was given.
        name: String,
        /// Why a policy the issue tracker names is not available, if it is one.
        note: &'static str,
    },
    /// `--recovery spare-cube` on a pod with no spare cubes.
    #[error(
        "--recovery spare-cube needs spare cubes, and {pod} has none: give a v4, v5p or \
         tpu7x pod file `cubes: (spares: N)`, or use rollback or redundant"
    )]
    NoSpareCube {
        /// The pod.
        pod: String,
    },
    /// A failure unit name that is not known.
    #[error(
        "unknown failure unit `{name}` (known: chip, host){}",
        crate::error::did_you_mean(name, ["chip", "host"])
    )]
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
    /// A run longer than a simulation covers.
    #[error(
        "--days {} is longer than the {} days a run simulates (about 27 years)",
        readable(*.days), readable(*.limit)
    )]
    TooLong {
        /// Simulated days.
        days: f64,
        /// The limit.
        limit: f64,
    },
    /// The run would draw more failures than a simulation should hold.
    #[error(
        "{} days at one failure every {} s is about {} failures, more than the {} a run \
         simulates; give a longer --mtbf-hours or fewer --days",
        readable(*.days), readable(*.system_mtbf_seconds), readable(.expected.round()),
        readable(*.limit as f64)
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
        "{} days of {} s steps is more than the {} steps a run counts; give a longer \
         --step-seconds (the whole training step) or fewer --days",
        readable(*.days), readable(*.step_seconds), readable(*.limit as f64)
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
    #[error(
        "{} days is shorter than one {} s step; simulate at least one step",
        readable(*.days), readable(*.step_seconds)
    )]
    ShorterThanAStep {
        /// Simulated days.
        days: f64,
        /// The step's length, seconds.
        step_seconds: f64,
    },
    /// The pod's torus has no shape the collectives accept, so its step
    /// cannot be modeled.
    #[error("cannot model the step on this pod: {source}; give --step-seconds")]
    Torus {
        /// Why the collectives refused the shape.
        #[source]
        source: CollectiveError,
    },
    /// The pod's step could not be modeled (the closed-form sharded step).
    #[error("cannot model the step on this pod: {source}; give --step-seconds")]
    Step {
        /// Why the sharded step was refused.
        #[source]
        source: StepModelError,
    },
}

impl From<GoodputError> for crate::error::OptimError {
    fn from(error: GoodputError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Goodput, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_messages_read_as_a_person_writes_them() {
        assert_eq!(readable(1.8446744073709552e19), "1.84e19");
        assert_eq!(readable(f64::MIN_POSITIVE), "2.23e-308");
        assert_eq!(readable(-0.0), "0");
        assert_eq!(readable(600.0), "600");
        assert_eq!(readable(0.25), "0.25");
        assert_eq!(readable(1e15), "1e15");
        let error = GoodputError::TooManySteps {
            days: 1e300,
            step_seconds: f64::MIN_POSITIVE,
            limit: 1_000_000_000_000_000,
        };
        assert_eq!(
            error.to_string(),
            "1e300 days of 2.23e-308 s steps is more than the 1e15 steps a run counts; give a \
             longer --step-seconds (the whole training step) or fewer --days"
        );
    }
}
