//! Pods compared: the best layout of one model on each, at one global
//! batch, by time to train a number of tokens and the chip-hours it
//! takes (priced only at a price the user gives).

use serde::Serialize;

use super::search::Candidate;

/// One pod's best layout and what training on it takes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodPlan {
    /// The pod's name.
    pub pod: String,
    /// Its chips.
    pub chips: usize,
    /// Its generation.
    pub generation: String,
    /// The best fitting layout (`None`: nothing fits).
    pub best: Option<Candidate>,
    /// Training the tokens, seconds (`None` when nothing fits).
    pub seconds_to_train: Option<f64>,
    /// Chips × hours of training.
    pub chip_hours: Option<f64>,
    /// `chip_hours × price` when a price per chip-hour is given.
    pub cost: Option<f64>,
}

impl PodPlan {
    /// `best` on `chips` chips training `tokens` tokens, priced at
    /// `price_per_chip_hour` if given.
    pub fn new(
        (pod, generation, chips): (String, String, usize),
        best: Option<Candidate>,
        tokens: f64,
        price_per_chip_hour: Option<f64>,
    ) -> PodPlan {
        let seconds = best
            .as_ref()
            .map(|b| tokens / (b.tokens_per_s_per_chip * chips as f64));
        let chip_hours = seconds.map(|s| s * chips as f64 / 3600.0);
        PodPlan {
            pod,
            chips,
            generation,
            best,
            seconds_to_train: seconds,
            chip_hours,
            cost: chip_hours.zip(price_per_chip_hour).map(|(h, p)| h * p),
        }
    }
}

/// The pods ordered by time to train, those where nothing fits last (in
/// the order given).
pub fn by_time_to_train(mut pods: Vec<PodPlan>) -> Vec<PodPlan> {
    pods.sort_by(|a, b| match (a.seconds_to_train, b.seconds_to_train) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    pods
}
