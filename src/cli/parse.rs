//! One parser per kind of value on the command line, shared by every
//! command, and the error that marks a bad value (exit code 2).
//!
//! A value clap parses with one of these is refused before the command
//! starts; a value that can only be checked later (against the pod, say)
//! is refused with [`usage`], which `main` maps to the same exit code.

use std::fmt;

/// A value on the command line that cannot be used: exit code 2, like a
/// value clap refuses.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A [`UsageError`] as an `anyhow::Error`, for `return Err(usage(..))`.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

/// Whether the error (or a cause) is a bad command-line value: a
/// [`UsageError`], or a domain error that says the command line named
/// nothing there is (an unknown pod, a missing input file or checkpoint
/// directory). An input that exists but cannot be read as what it should
/// be (a malformed pod file, a damaged checkpoint) is a runtime failure.
pub fn is_usage(error: &anyhow::Error) -> bool {
    use optirs_tpu::checkpoint::CheckpointError;
    use optirs_tpu::files::InputError;
    use optirs_tpu::topology::TopologyError;
    error.chain().any(|cause| {
        cause.is::<UsageError>()
            || matches!(
                cause.downcast_ref::<TopologyError>(),
                Some(
                    TopologyError::UnknownPod { .. }
                        | TopologyError::NotCloudType { .. }
                        | TopologyError::Read(InputError::Missing { .. })
                )
            )
            || matches!(
                cause.downcast_ref::<InputError>(),
                Some(InputError::Missing { .. })
            )
            || matches!(
                cause.downcast_ref::<CheckpointError>(),
                Some(CheckpointError::NoDirectory { .. })
            )
    })
}

/// A command-line error as clap renders it (several lines: the error,
/// the possible values, a tip, the usage) in one line: the error, the
/// possible values, and the tip's similar name as a did-you-mean; the
/// usage and the pointer to `--help` are left out.
pub fn one_line(rendered: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() || line.starts_with("Usage:") || line.starts_with("For more information")
        {
            continue;
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        match line.strip_prefix("tip: ") {
            Some(tip) => match tip.split_once(" exists: ").or(tip.split_once(" exist: ")) {
                Some((_, names)) => parts.push(format!("; did you mean {names}?")),
                None => parts.push(format!("; {tip}")),
            },
            None => parts.push(format!(" {line}")),
        }
    }
    parts
        .concat()
        .trim()
        .replace(": ;", ";")
        .replace(":  ", ": ")
}

/// `--prefetch`: a whole number from 0 (`1e3` reads as 1000, as every
/// count does) up to [`MAX_PREFETCH`].
///
/// [`MAX_PREFETCH`]: optirs_tpu::sharding::residency::MAX_PREFETCH
pub fn parse_prefetch(text: &str) -> Result<usize, String> {
    use optirs_tpu::sharding::residency::MAX_PREFETCH;
    if text.trim() == "0" {
        return Ok(0);
    }
    let n = parse_count(text).map_err(|_| {
        format!("`{text}` is not a whole number from 0 like 0, 1 or 4 (gathers ahead of use)")
    })?;
    if n > MAX_PREFETCH {
        return Err(format!(
            "`{text}` is more than {MAX_PREFETCH}: an fsdp step gathers at most {MAX_PREFETCH} \
             buckets ahead of the one in use (each is a bucket of HBM; 1 or 2 is usual)"
        ));
    }
    Ok(n)
}

/// A positive whole number: `4096`, `10_000_000`, `1e7`, `2.5e6`.
pub fn parse_count(text: &str) -> Result<usize, String> {
    let bad = || format!("`{text}` is not a positive whole number like 4096, 10_000_000 or 1e7");
    let digits: String = text.trim().chars().filter(|&c| c != '_').collect();
    let value = match digits.split_once(['e', 'E']) {
        None => digits.parse::<u128>().map_err(|_| bad())?,
        Some((mantissa, exponent)) => {
            let exponent: u32 = exponent.parse().map_err(|_| bad())?;
            let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
            if whole.is_empty() && fraction.is_empty() {
                return Err(bad());
            }
            let shift = exponent
                .checked_sub(fraction.len() as u32)
                .ok_or_else(|| format!("`{text}` is not a whole number"))?;
            let mantissa: u128 = format!("{whole}{fraction}").parse().map_err(|_| bad())?;
            10u128
                .checked_pow(shift)
                .and_then(|scale| mantissa.checked_mul(scale))
                .ok_or_else(|| format!("`{text}` is too large"))?
        }
    };
    if value == 0 {
        return Err(bad());
    }
    usize::try_from(value).map_err(|_| format!("`{text}` is too large"))
}

/// `--bucket-bytes`: a count of bytes that holds at least one f32
/// element (4 bytes); a smaller bucket could pack nothing.
pub fn parse_bucket_bytes(text: &str) -> Result<usize, String> {
    let bytes = parse_count(text)?;
    if bytes < 4 {
        return Err(format!(
            "`{text}` bytes hold no f32 element (4 bytes): give at least 4"
        ));
    }
    Ok(bytes)
}

/// [`parse_count`] as a `u64` (steps, ticks).
pub fn parse_count_u64(text: &str) -> Result<u64, String> {
    parse_count(text).map(|n| n as u64)
}

/// The longest duration or time any command takes: 10^9 s (about 32
/// years). Past it a simulated clock in nanoseconds loses its meaning.
pub const MAX_SECONDS: f64 = 1e9;

/// A duration in seconds: finite, above 0, at most [`MAX_SECONDS`]
/// (`0.5`, `1e-3`, `3600`).
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    parse_positive(text, MAX_SECONDS).map_err(|_| {
        format!(
            "`{text}` is not a duration: give seconds above 0 and at most {}",
            number(MAX_SECONDS)
        )
    })
}

/// A point in simulated time, seconds from the start: finite, at least 0,
/// below [`MAX_SECONDS`].
pub fn parse_instant(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a time in seconds"))?;
    if !(value.is_finite() && (0.0..MAX_SECONDS).contains(&value)) {
        return Err(format!(
            "`{text}` is not a time: give seconds from 0 up to {}",
            number(MAX_SECONDS)
        ));
    }
    Ok(value)
}

/// A positive finite number in any unit (hours, days, bytes per second):
/// above 0 and at most `max`.
pub fn parse_positive(text: &str, max: f64) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if !(value.is_finite() && value > 0.0 && value <= max) {
        return Err(format!(
            "`{text}` is out of range: give a number above 0 and at most {}",
            number(max)
        ));
    }
    Ok(value)
}

/// A finite number (a learning rate: any sign, not NaN or infinite).
pub fn parse_finite(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("`{text}` is not a finite number"))
}

/// `DEVICE@SECONDS`: device 5 at 3.5 s is `5@3.5`.
pub fn parse_timed_device(text: &str) -> Result<(u32, f64), String> {
    let (device, seconds) = text
        .split_once('@')
        .ok_or_else(|| format!("`{text}` is not DEVICE@SECONDS (e.g. 5@3.5)"))?;
    let device = device
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("`{device}` is not a device id"))?;
    Ok((device, parse_instant(seconds)?))
}

/// A whole number that may be 0 (ticks to run before a save): `0`,
/// `4096`, `1e3`, with [`parse_count`]'s rules otherwise.
pub fn parse_count_or_zero(text: &str) -> Result<u64, String> {
    let zero = text
        .trim()
        .split(['e', 'E'])
        .next()
        .is_some_and(|m| !m.is_empty() && m.chars().all(|c| matches!(c, '0' | '_' | '.')));
    if zero && parse_count(&text.replacen('0', "1", 1)).is_ok() {
        return Ok(0);
    }
    parse_count_u64(text)
        .map_err(|_| format!("`{text}` is not a whole number like 0, 4096, 10_000_000 or 1e7"))
}

/// `A-B@SECONDS`: the link between devices 3 and 7 at 2.5 s is `3-7@2.5`.
pub fn parse_timed_link(text: &str) -> Result<(u32, u32, f64), String> {
    let bad = || format!("`{text}` is not DEVICE-DEVICE@SECONDS (e.g. 3-7@2.5)");
    let (pair, seconds) = text.split_once('@').ok_or_else(bad)?;
    let (a, b) = pair.split_once('-').ok_or_else(bad)?;
    let device = |d: &str| {
        d.trim()
            .parse::<u32>()
            .map_err(|_| format!("`{d}` is not a device id (in `{text}`)"))
    };
    let (a, b) = (device(a)?, device(b)?);
    if a == b {
        return Err(format!(
            "`{text}` names device {a} twice: a link joins two devices"
        ));
    }
    Ok((a, b, parse_instant(seconds)?))
}

/// A number for a person: plain digits in the usual range, scientific
/// notation outside it (`1.8e19`, `2.2e-308`), never `-0`.
pub fn number(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if !value.is_finite() {
        return value.to_string();
    }
    let magnitude = value.abs();
    if (1e-3..1e9).contains(&magnitude) {
        let text = format!("{value:.6}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        return text.to_string();
    }
    let text = format!("{value:.2e}");
    // 1.80e19 -> 1.8e19
    match text.split_once('e') {
        Some((mantissa, exponent)) => {
            let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
            format!("{mantissa}e{exponent}")
        }
        None => text,
    }
}

/// How long a rank of a split run waits for another when `--rank-timeout`
/// is not given.
const DEFAULT_RANK_TIMEOUT_SECONDS: f64 = 30.0;

/// How long the ranks of a split run wait for each other: `--rank-timeout`
/// (`given`), or 30 s.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn rank_timeout(given: Option<f64>) -> std::time::Duration {
    std::time::Duration::from_secs_f64(given.unwrap_or(DEFAULT_RANK_TIMEOUT_SECONDS))
}

/// Refuses `--rank-timeout` (`given`) in `command` (`run`, `train`) run in
/// one process, which waits for no other rank: accepted, it would do
/// nothing.
pub fn refuse_rank_timeout_in_one_process(given: Option<f64>, command: &str) -> anyhow::Result<()> {
    match given {
        None => Ok(()),
        Some(seconds) => Err(usage(format!(
            "--rank-timeout {}: a run in one process waits for no other rank; the flag bounds \
             how long the ranks of a split run wait for each other (`mpirun -n R optirs-tpu \
             {command} … --rank-timeout SECONDS`)",
            number(seconds)
        ))),
    }
}

/// `--rank-timeout`: seconds above 0, at most a day.
pub fn parse_rank_timeout(text: &str) -> Result<f64, String> {
    parse_positive(text, 86_400.0)
        .map_err(|_| format!("`{text}` is not a timeout: give seconds above 0 and at most 86400"))
}

/// A learning rate: finite, and still itself in f32, where the update
/// runs (`1e300` would be infinite there and `1e-300` zero).
pub fn parse_learning_rate(text: &str) -> Result<f64, String> {
    let lr = parse_finite(text)?;
    let single = lr as f32;
    if single.is_infinite() || (lr != 0.0 && single == 0.0) {
        return Err(format!(
            "`{text}` is outside the f32 range the update runs in: give a learning rate \
             between {} and {} in magnitude, or 0",
            number(f64::from(f32::from_bits(1))),
            number(f64::from(f32::MAX))
        ));
    }
    Ok(lr)
}

/// A seed: 0, or any whole number [`parse_count_u64`] reads.
pub fn parse_seed(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    parse_count_u64(text).map_err(|_| {
        format!(
            "`{text}` is not a seed: give a whole number from 0 to {}",
            u64::MAX
        )
    })
}

/// A tick in milliseconds, within the bounds a pod file's tick has.
pub fn parse_tick_ms(text: &str) -> Result<f64, String> {
    let ms = parse_positive(
        text,
        optirs_tpu::topology::resolve::MAX_TICK_NS as f64 * 1e-6,
    )?;
    if ms * 1e6 < optirs_tpu::topology::resolve::MIN_TICK_NS as f64 {
        return Err(format!(
            "`{text}` ms is shorter than the shortest tick a pod file may have ({} ns)",
            optirs_tpu::topology::resolve::MIN_TICK_NS
        ));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_digits_underscores_and_exponents() {
        assert_eq!(parse_count("4096"), Ok(4096));
        assert_eq!(parse_count("10_000_000"), Ok(10_000_000));
        assert_eq!(parse_count("1e7"), Ok(10_000_000));
        assert_eq!(parse_count("2.5e6"), Ok(2_500_000));
        assert_eq!(parse_count("1e11"), Ok(100_000_000_000));
        assert_eq!(parse_count_u64("1e3"), Ok(1000));
        for bad in [
            "0", "0e3", "-1", "1.5", "abc", "", "e7", "1e", "2.55e1", "1e40",
        ] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_are_positive_finite_and_bounded() {
        assert_eq!(parse_seconds("0.5"), Ok(0.5));
        assert_eq!(parse_seconds("1e-9"), Ok(1e-9));
        for bad in ["0", "-1", "nan", "inf", "1e300", "x", ""] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_instant("0"), Ok(0.0));
        for bad in ["-0.1", "nan", "1e300"] {
            assert!(parse_instant(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_timed_device("5@3.5"), Ok((5, 3.5)));
        assert!(parse_timed_device("5@nan").is_err());
        assert!(parse_finite("nan").is_err());
        assert!(parse_positive("0", 10.0).is_err());
        assert!(parse_positive("11", 10.0).is_err());
    }

    #[test]
    fn zero_counts_and_timed_links() {
        assert_eq!(parse_count_or_zero("0"), Ok(0));
        assert_eq!(parse_count_or_zero("0e3"), Ok(0));
        assert_eq!(parse_count_or_zero("1e3"), Ok(1000));
        assert_eq!(parse_count_or_zero("12"), Ok(12));
        for bad in ["-1", "-0", "nan", "1.5", "", "0x", "1e40"] {
            assert!(parse_count_or_zero(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_timed_link("3-7@2.5"), Ok((3, 7, 2.5)));
        for bad in ["3-3@1", "3@1", "3-7", "a-7@1", "3-7@nan", "3-7@-1"] {
            assert!(parse_timed_link(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn numbers_read_as_a_person_writes_them() {
        assert_eq!(number(1.8446744073709552e19), "1.84e19");
        assert_eq!(number(2.2250738585072014e-308), "2.23e-308");
        assert_eq!(number(-0.0), "0");
        assert_eq!(number(600.0), "600");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(1e9), "1e9");
    }

    #[test]
    fn usage_errors_are_found_through_context() {
        let error = usage("bad").context("outer");
        assert!(is_usage(&error));
        assert!(!is_usage(&anyhow::anyhow!("runtime")));
    }

    #[test]
    fn a_clap_error_is_one_line_with_its_suggestion() {
        let rendered = "error: invalid value 'adamm' for '--optimizer <OPTIMIZER>'\n  \
            [possible values: sgd, adam]\n\n  tip: a similar value exists: 'adam'\n\n\
            For more information, try '--help'.\n";
        assert_eq!(
            one_line(rendered),
            "invalid value 'adamm' for '--optimizer <OPTIMIZER>' [possible values: sgd, adam]; \
             did you mean 'adam'?"
        );
        let missing = "error: the following required arguments were not provided:\n  \
            --days <D>\n\nUsage: optirs-tpu goodput --days <D>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(missing),
            "the following required arguments were not provided: --days <D>"
        );
    }
}
