//! NTP-style clock offset estimation (RFC 5905) between simulated clocks.
//!
//! **On-wire protocol** (RFC 5905 §8). A client sends a request at its local
//! time `t1`; the server receives it at its local time `t2` and replies at
//! `t3`; the client receives the reply at `t4`. Then
//!
//! * offset `θ = ((t2 − t1) + (t3 − t4)) / 2`: how far the server's clock is
//!   ahead of the client's (add `θ` to the client's clock to agree with the
//!   server);
//! * delay `δ = (t4 − t1) − (t3 − t2)`: the round trip minus the server's
//!   turnaround.
//!
//! If the two one-way delays are `d↑` and `d↓`, `θ` is the true offset plus
//! `(d↑ − d↓)/2` (plus what the clocks drift during the exchange): the error
//! is half the asymmetry, which no two-way protocol can observe. An exchange
//! with `t4 < t1`, `t3 < t2` or `δ < 0` is physically impossible and is an
//! error ([`ClockError`]), never an offset.
//!
//! **Clock filter** (RFC 5905 §10). [`ClockFilter`] keeps the last
//! [`FILTER_STAGES`] (8) samples and selects the one with the least delay,
//! whose offset suffered the least queueing; jitter is the RMS of the other
//! samples' offset differences from the selected one. Not modeled here: the
//! dispersion that grows with sample age, the popcorn-spike suppressor and
//! the clock discipline (which steers the clock rather than estimating it).
//!
//! **Simulated clocks.** A [`SimulatedClock`] maps true time to local time
//! with a fixed offset and a drift in ppm, so tests and the pod know the
//! truth; [`exchange`] performs the four-timestamp exchange between two of
//! them over a link with given (possibly asymmetric) one-way delays.
//!
//! All times are `i64` nanoseconds; offsets are `f64` nanoseconds, exact to
//! the half nanosecond the division by two can produce (below 2⁵² ns, about
//! 52 days). Intermediate arithmetic is `i128`, so no input overflows.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Samples kept by the clock filter (RFC 5905's `NSTAGE`).
pub const FILTER_STAGES: usize = 8;

/// A rejected exchange or clock input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ClockError {
    /// The reply arrived (client time `t4`) before the request left (`t1`).
    #[error(
        "inconsistent NTP exchange: the client received the reply at t4 = {t4} ns, before it sent the request at t1 = {t1} ns"
    )]
    ReplyBeforeRequest {
        /// Client send time.
        t1: i64,
        /// Client receive time.
        t4: i64,
    },
    /// The server replied (`t3`) before it received the request (`t2`).
    #[error(
        "inconsistent NTP exchange: the server sent its reply at t3 = {t3} ns, before it received the request at t2 = {t2} ns"
    )]
    ServerRepliedBeforeReceiving {
        /// Server receive time.
        t2: i64,
        /// Server send time.
        t3: i64,
    },
    /// The server's turnaround exceeds the client's round trip.
    #[error(
        "inconsistent NTP exchange: negative delay {delay_ns} ns (the server held the request {turnaround_ns} ns, longer than the client's round trip of {round_trip_ns} ns)"
    )]
    NegativeDelay {
        /// `δ = (t4 − t1) − (t3 − t2)`.
        delay_ns: i128,
        /// `t4 − t1`.
        round_trip_ns: i128,
        /// `t3 − t2`.
        turnaround_ns: i128,
    },
    /// A link delay or turnaround was negative.
    #[error("{what} must be ≥ 0 ns, got {value_ns} ns")]
    NegativeDuration {
        /// Which duration.
        what: &'static str,
        /// Its value.
        value_ns: i64,
    },
    /// A timestamp of the simulated exchange left the `i64` nanosecond range.
    #[error(
        "simulated time {true_ns} ns plus the exchange's delays leaves the i64 nanosecond range"
    )]
    TimeOutOfRange {
        /// The true send time requested.
        true_ns: i64,
    },
}

/// The four timestamps of one exchange, in nanoseconds of the clock that
/// took each: `t1`, `t4` on the client, `t2`, `t3` on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NtpSample {
    t1: i64,
    t2: i64,
    t3: i64,
    t4: i64,
}

impl NtpSample {
    /// A sample, rejected if it is physically inconsistent: `t4 < t1`,
    /// `t3 < t2`, or a negative delay.
    pub fn new(t1: i64, t2: i64, t3: i64, t4: i64) -> Result<Self, ClockError> {
        if t4 < t1 {
            return Err(ClockError::ReplyBeforeRequest { t1, t4 });
        }
        if t3 < t2 {
            return Err(ClockError::ServerRepliedBeforeReceiving { t2, t3 });
        }
        let round_trip_ns = i128::from(t4) - i128::from(t1);
        let turnaround_ns = i128::from(t3) - i128::from(t2);
        let delay_ns = round_trip_ns - turnaround_ns;
        if delay_ns < 0 {
            return Err(ClockError::NegativeDelay {
                delay_ns,
                round_trip_ns,
                turnaround_ns,
            });
        }
        Ok(Self { t1, t2, t3, t4 })
    }

    /// The timestamps `[t1, t2, t3, t4]`.
    pub fn timestamps(&self) -> [i64; 4] {
        [self.t1, self.t2, self.t3, self.t4]
    }

    /// `θ = ((t2 − t1) + (t3 − t4)) / 2`, nanoseconds: the server's clock
    /// minus the client's.
    pub fn offset_ns(&self) -> f64 {
        let twice = (i128::from(self.t2) - i128::from(self.t1))
            + (i128::from(self.t3) - i128::from(self.t4));
        twice as f64 / 2.0
    }

    /// `δ = (t4 − t1) − (t3 − t2)`, nanoseconds, never negative. Saturates at
    /// `i64::MAX` for round trips beyond 292 years.
    pub fn delay_ns(&self) -> i64 {
        let delay = (i128::from(self.t4) - i128::from(self.t1))
            - (i128::from(self.t3) - i128::from(self.t2));
        i64::try_from(delay).unwrap_or(i64::MAX)
    }
}

/// What the clock filter currently believes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OffsetEstimate {
    /// Offset of the selected (least-delay) sample, nanoseconds.
    pub offset_ns: f64,
    /// Its delay, nanoseconds.
    pub delay_ns: i64,
    /// RMS of the other samples' offsets minus the selected offset,
    /// nanoseconds (0 with a single sample).
    pub jitter_ns: f64,
    /// Samples in the filter (at most [`FILTER_STAGES`]).
    pub samples: usize,
}

/// RFC 5905's clock filter: the last [`FILTER_STAGES`] samples, the one
/// with the least delay selected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockFilter {
    samples: VecDeque<NtpSample>,
}

impl ClockFilter {
    /// An empty filter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sample, evicting the oldest beyond [`FILTER_STAGES`].
    pub fn push(&mut self, sample: NtpSample) {
        if self.samples.len() == FILTER_STAGES {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// The samples held, oldest first.
    pub fn samples(&self) -> impl ExactSizeIterator<Item = &NtpSample> {
        self.samples.iter()
    }

    /// The least-delay sample (the newest of equals, as RFC 5905's filter
    /// keeps its shift register newest first, so a drifting clock is tracked)
    /// and the jitter, or `None` before the first sample.
    pub fn estimate(&self) -> Option<OffsetEstimate> {
        let best = self
            .samples
            .iter()
            .enumerate()
            .min_by_key(|(i, s)| (s.delay_ns(), std::cmp::Reverse(*i)))
            .map(|(_, s)| s)?;
        let offset_ns = best.offset_ns();
        let others = self.samples.len() - 1;
        let jitter_ns = if others == 0 {
            0.0
        } else {
            // The selected sample contributes a zero difference; RFC 5905
            // divides by the other samples' count.
            let sum: f64 = self
                .samples
                .iter()
                .map(|s| (s.offset_ns() - offset_ns).powi(2))
                .sum();
            (sum / others as f64).sqrt()
        };
        Some(OffsetEstimate {
            offset_ns,
            delay_ns: best.delay_ns(),
            jitter_ns,
            samples: self.samples.len(),
        })
    }
}

/// Estimates one peer's clock offset from repeated four-timestamp exchanges
/// (one association, in RFC 5905's terms; a pod keeps one per device).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NtpSynchronizer {
    filter: ClockFilter,
    rejected: u64,
}

impl NtpSynchronizer {
    /// A synchronizer with no samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates the timestamps of one exchange, feeds the filter and
    /// returns the updated estimate. An inconsistent exchange is counted in
    /// [`NtpSynchronizer::rejected`], returned as the error, and leaves the
    /// filter unchanged.
    pub fn record(
        &mut self,
        t1: i64,
        t2: i64,
        t3: i64,
        t4: i64,
    ) -> Result<OffsetEstimate, ClockError> {
        let sample = NtpSample::new(t1, t2, t3, t4).inspect_err(|_| self.rejected += 1)?;
        Ok(self.record_sample(sample))
    }

    /// Feeds an already validated sample and returns the updated estimate.
    pub fn record_sample(&mut self, sample: NtpSample) -> OffsetEstimate {
        self.filter.push(sample);
        // The filter holds at least `sample` now; the fallback is that sample.
        self.filter.estimate().unwrap_or(OffsetEstimate {
            offset_ns: sample.offset_ns(),
            delay_ns: sample.delay_ns(),
            jitter_ns: 0.0,
            samples: 1,
        })
    }

    /// The current estimate, `None` before the first accepted sample.
    pub fn estimate(&self) -> Option<OffsetEstimate> {
        self.filter.estimate()
    }

    /// The clock filter.
    pub fn filter(&self) -> &ClockFilter {
        &self.filter
    }

    /// Exchanges rejected as inconsistent so far.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }
}

/// A device clock: `local = true + offset_ns + drift_ppm·10⁻⁶·true`, in
/// nanoseconds, rounded to the nearest nanosecond and saturating at the
/// `i64` range. A non-finite drift contributes nothing (Rust's saturating
/// float-to-int conversion maps NaN to 0 and ±∞ to the range ends).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct SimulatedClock {
    /// Offset from true time at true time 0, nanoseconds.
    pub offset_ns: i64,
    /// Rate error, parts per million (positive runs fast).
    pub drift_ppm: f64,
}

impl SimulatedClock {
    /// The local reading at true time `true_ns`.
    pub fn local_ns(&self, true_ns: i64) -> i64 {
        let drift = if self.drift_ppm.is_finite() {
            (true_ns as f64 * self.drift_ppm * 1e-6).round() as i128
        } else {
            0
        };
        let local = i128::from(true_ns) + i128::from(self.offset_ns) + drift;
        i64::try_from(local).unwrap_or(if local < 0 { i64::MIN } else { i64::MAX })
    }

    /// `other`'s reading minus this clock's at true time `true_ns`: the
    /// offset an exchange with `other` as server should estimate.
    pub fn offset_to(&self, other: &SimulatedClock, true_ns: i64) -> i64 {
        other
            .local_ns(true_ns)
            .saturating_sub(self.local_ns(true_ns))
    }
}

/// One-way delays of a link and the server's processing time, nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExchangeDelays {
    /// Client → server.
    pub request_ns: i64,
    /// Server → client.
    pub reply_ns: i64,
    /// Between the server's receive and send.
    pub turnaround_ns: i64,
}

/// Performs an exchange that leaves the client at true time `true_send_ns`:
/// each timestamp is the reading of the clock that takes it when the
/// message passes. Negative delays and times beyond the `i64` range are
/// errors; a drift so large that the timestamps are inconsistent is
/// rejected as [`NtpSample::new`] would.
pub fn exchange(
    client: &SimulatedClock,
    server: &SimulatedClock,
    delays: ExchangeDelays,
    true_send_ns: i64,
) -> Result<NtpSample, ClockError> {
    for (what, value_ns) in [
        ("the request delay", delays.request_ns),
        ("the reply delay", delays.reply_ns),
        ("the server turnaround", delays.turnaround_ns),
    ] {
        if value_ns < 0 {
            return Err(ClockError::NegativeDuration { what, value_ns });
        }
    }
    let out_of_range = ClockError::TimeOutOfRange {
        true_ns: true_send_ns,
    };
    let received = true_send_ns
        .checked_add(delays.request_ns)
        .ok_or(out_of_range.clone())?;
    let replied = received
        .checked_add(delays.turnaround_ns)
        .ok_or(out_of_range.clone())?;
    let back = replied.checked_add(delays.reply_ns).ok_or(out_of_range)?;
    NtpSample::new(
        client.local_ns(true_send_ns),
        server.local_ns(received),
        server.local_ns(replied),
        client.local_ns(back),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn offset_and_delay_follow_rfc_5905() {
        // Server 1 ms ahead; 300 µs up, 100 µs down, 50 µs turnaround.
        let s = NtpSample::new(0, 1_300_000, 1_350_000, 450_000).unwrap();
        assert_eq!(s.delay_ns(), 400_000);
        // θ = ((1.3 ms) + (0.9 ms)) / 2 = 1.1 ms: truth + (300 − 100)/2 µs.
        assert_eq!(s.offset_ns(), 1_100_000.0);
        let half = NtpSample::new(0, 1, 1, 2).unwrap();
        assert_eq!(half.offset_ns(), 0.0);
        assert_eq!(NtpSample::new(0, 2, 3, 2).unwrap().offset_ns(), 1.5);
    }

    #[test]
    fn inconsistent_exchanges_are_errors() {
        assert_eq!(
            NtpSample::new(10, 20, 30, 5),
            Err(ClockError::ReplyBeforeRequest { t1: 10, t4: 5 })
        );
        assert_eq!(
            NtpSample::new(0, 30, 20, 50),
            Err(ClockError::ServerRepliedBeforeReceiving { t2: 30, t3: 20 })
        );
        let err = NtpSample::new(0, 100, 200, 50).unwrap_err();
        assert!(matches!(
            err,
            ClockError::NegativeDelay { delay_ns: -50, .. }
        ));
        assert_eq!(
            err.to_string(),
            "inconsistent NTP exchange: negative delay -50 ns (the server held the request 100 ns, \
             longer than the client's round trip of 50 ns)"
        );
        let mut sync = NtpSynchronizer::new();
        assert!(sync.record(10, 20, 30, 5).is_err());
        assert_eq!(sync.rejected(), 1);
        assert_eq!(sync.estimate(), None);
        // Extreme timestamps do not overflow.
        assert!(NtpSample::new(i64::MIN, i64::MAX, i64::MAX, i64::MAX).is_ok());
    }

    #[test]
    fn filter_selects_least_delay_of_the_last_eight() {
        let mut sync = NtpSynchronizer::new();
        // Delay 10 ns with offset 5, then eight noisier samples.
        sync.record(0, 10, 10, 10).unwrap();
        assert_eq!(sync.estimate().unwrap().delay_ns, 10);
        for k in 1..=7 {
            sync.record(0, 100 + k, 100 + k, 100 + 2 * k).unwrap();
        }
        let est = sync.estimate().unwrap();
        assert_eq!((est.delay_ns, est.offset_ns, est.samples), (10, 5.0, 8));
        // The ninth sample evicts the least-delay one.
        sync.record(0, 50, 50, 100).unwrap();
        let est = sync.estimate().unwrap();
        assert_eq!(est.samples, FILTER_STAGES);
        assert_eq!((est.delay_ns, est.offset_ns), (100, 0.0));
    }

    #[test]
    fn jitter_is_the_rms_of_offset_differences() {
        let mut filter = ClockFilter::new();
        // Offsets 0 (delay 2, selected), 3, −3, 6 (larger delays).
        filter.push(NtpSample::new(0, 1, 1, 2).unwrap());
        filter.push(NtpSample::new(0, 5, 5, 4).unwrap());
        filter.push(NtpSample::new(0, -1, -1, 4).unwrap());
        filter.push(NtpSample::new(0, 8, 8, 4).unwrap());
        let est = filter.estimate().unwrap();
        assert_eq!(est.offset_ns, 0.0);
        let expected = ((9.0 + 9.0 + 36.0) / 3.0f64).sqrt();
        assert!((est.jitter_ns - expected).abs() < 1e-12);
    }

    #[test]
    fn simulated_exchange_recovers_a_symmetric_offset_exactly() {
        let client = SimulatedClock {
            offset_ns: -2_000,
            drift_ppm: 0.0,
        };
        let server = SimulatedClock {
            offset_ns: 750_000,
            drift_ppm: 0.0,
        };
        let delays = ExchangeDelays {
            request_ns: 5_000,
            reply_ns: 5_000,
            turnaround_ns: 1_000,
        };
        let s = exchange(&client, &server, delays, 1_000_000_000).unwrap();
        assert_eq!(s.offset_ns(), 752_000.0);
        assert_eq!(s.delay_ns(), 10_000);
        let bad = ExchangeDelays {
            request_ns: -1,
            ..delays
        };
        assert!(matches!(
            exchange(&client, &server, bad, 0),
            Err(ClockError::NegativeDuration { value_ns: -1, .. })
        ));
        assert!(exchange(&client, &server, delays, i64::MAX).is_err());
    }

    #[test]
    fn synchronizer_over_a_queueing_link_converges_on_the_quiet_exchange() {
        let client = SimulatedClock {
            offset_ns: 0,
            drift_ppm: 20.0,
        };
        let server = SimulatedClock {
            offset_ns: 3_000_000,
            drift_ppm: -15.0,
        };
        let mut sync = NtpSynchronizer::new();
        // Queueing adds up to 400 µs on the request path; exchange 5 is quiet.
        for k in 0..8i64 {
            let queueing = if k == 5 { 0 } else { 50_000 * (k + 1) };
            let delays = ExchangeDelays {
                request_ns: 2_000 + queueing,
                reply_ns: 2_000,
                turnaround_ns: 500,
            };
            let sample = exchange(&client, &server, delays, k * 1_000_000_000).unwrap();
            sync.record_sample(sample);
        }
        let est = sync.estimate().unwrap();
        assert_eq!(est.samples, 8);
        assert!((est.delay_ns - 4_000).abs() <= 2, "{est:?}");
        let truth = client.offset_to(&server, 5_000_000_000) as f64;
        assert!(
            (est.offset_ns - truth).abs() <= 2.0,
            "{} vs {truth}",
            est.offset_ns
        );
        assert!(
            est.jitter_ns > 10_000.0,
            "queueing shows up as jitter: {est:?}"
        );
    }

    proptest! {
        #[test]
        fn estimate_is_within_half_the_asymmetry_plus_drift(
            client_offset in -1_000_000_000_000i64..1_000_000_000_000,
            server_offset in -1_000_000_000_000i64..1_000_000_000_000,
            client_ppm in -200.0f64..200.0,
            server_ppm in -200.0f64..200.0,
            request in 0i64..10_000_000,
            reply in 0i64..10_000_000,
            turnaround in 0i64..1_000_000,
            start in 0i64..1_000_000_000_000,
        ) {
            let client = SimulatedClock { offset_ns: client_offset, drift_ppm: client_ppm };
            let server = SimulatedClock { offset_ns: server_offset, drift_ppm: server_ppm };
            let delays = ExchangeDelays { request_ns: request, reply_ns: reply, turnaround_ns: turnaround };
            let sample = exchange(&client, &server, delays, start).unwrap();
            let round_trip = (request + reply + turnaround) as f64;
            // Truth at the middle of the exchange; the clocks' drift over the
            // exchange and four roundings bound the rest.
            let truth = client.offset_to(&server, start + (request + turnaround + reply) / 2) as f64;
            let bound = (request - reply).abs() as f64 / 2.0
                + (client_ppm.abs() + server_ppm.abs()) * 1e-6 * round_trip
                + 4.0;
            prop_assert!((sample.offset_ns() - truth).abs() <= bound,
                "θ = {} truth = {} bound = {}", sample.offset_ns(), truth, bound);
            prop_assert!(sample.delay_ns() >= 0);
        }

        #[test]
        fn without_drift_the_error_is_exactly_half_the_asymmetry(
            client_offset in -1_000_000_000_000i64..1_000_000_000_000,
            server_offset in -1_000_000_000_000i64..1_000_000_000_000,
            request in 0i64..10_000_000,
            reply in 0i64..10_000_000,
            turnaround in 0i64..1_000_000,
            start in -1_000_000_000_000i64..1_000_000_000_000,
        ) {
            let client = SimulatedClock { offset_ns: client_offset, drift_ppm: 0.0 };
            let server = SimulatedClock { offset_ns: server_offset, drift_ppm: 0.0 };
            let delays = ExchangeDelays { request_ns: request, reply_ns: reply, turnaround_ns: turnaround };
            let sample = exchange(&client, &server, delays, start).unwrap();
            let truth = (server_offset - client_offset) as f64;
            prop_assert_eq!(sample.offset_ns() - truth, (request - reply) as f64 / 2.0);
            prop_assert_eq!(sample.delay_ns(), request + reply);
        }

        #[test]
        fn filter_output_is_the_least_delay_sample(delays in prop::collection::vec((0i64..1_000, -500i64..500), 1..20)) {
            let mut sync = NtpSynchronizer::new();
            for &(delay, offset) in &delays {
                // t1 = 0, t2 = t3 = offset, t4 = delay: δ = delay.
                sync.record(0, offset, offset, delay).unwrap();
            }
            let kept = &delays[delays.len().saturating_sub(FILTER_STAGES)..];
            let est = sync.estimate().unwrap();
            prop_assert_eq!(est.delay_ns, kept.iter().map(|d| d.0).min().unwrap());
            prop_assert_eq!(est.samples, kept.len());
            prop_assert!(est.jitter_ns >= 0.0);
        }
    }
}
