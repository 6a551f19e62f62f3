//! A progress bar for long commands, on a terminal only.
//!
//! Drawn on stderr, and only when both stdout and stderr are terminals and
//! the output is not JSON: piped or machine-read output stays clean. The
//! ETA is an estimate from the work done in the wall time so far, and `?`
//! until some work is done.

use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use optirs_tpu::training::StepPart;
use std::io::IsTerminal;
use std::time::Duration;

/// Units a [`steps_bar`] counts per step, so it moves inside a step.
pub const UNITS_PER_STEP: u64 = 1000;

/// The share of a step's units the gradients' reduction fills (the rest
/// is the step in flight): in a large pod's run most of a step's wall
/// time goes to making and reducing every replica's gradients.
pub const GRADIENTS_SHARE: f64 = 0.9;

/// Units of a step done at `fraction` of `part`, below a whole step (the
/// step counts as done only when it completes).
pub fn within_step(part: StepPart, fraction: f64) -> u64 {
    let fraction = if fraction.is_nan() {
        0.0
    } else {
        fraction.clamp(0.0, 1.0)
    };
    let share = match part {
        StepPart::Gradients => GRADIENTS_SHARE * fraction,
        StepPart::InFlight => GRADIENTS_SHARE + (1.0 - GRADIENTS_SHARE) * fraction,
    };
    ((share * UNITS_PER_STEP as f64) as u64).min(UNITS_PER_STEP - 1)
}

/// Whether progress should be drawn: a person is watching both streams
/// and the output is not JSON.
fn visible(json: bool) -> bool {
    !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// The wall time left when `done` of `total` is done in `elapsed`: the
/// rate so far over what is left; `None` before any work is done.
pub fn eta(done: f64, total: f64, elapsed: Duration) -> Option<Duration> {
    if !(done > 0.0 && total > 0.0 && elapsed > Duration::ZERO) {
        return None;
    }
    let left = (total - done).max(0.0);
    Duration::try_from_secs_f64(elapsed.as_secs_f64() * left / done).ok()
}

/// [`eta`] for a person: `?` without a basis, else `45s`, `3m 05s`,
/// `1h 02m`.
pub fn eta_text(done: f64, total: f64, elapsed: Duration) -> String {
    let Some(left) = eta(done, total, elapsed) else {
        return "?".to_string();
    };
    let s = left.as_secs_f64().round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s / 60 % 60),
    }
}

/// `3.4/20`: whole steps and the tenth of the one in flight, from a
/// [`steps_bar`]'s position.
pub fn steps_text(position: u64, steps: u64) -> String {
    let done = position as f64 / UNITS_PER_STEP as f64;
    format!("{:.1}/{steps}", (done * 10.0).floor() / 10.0)
}

fn style(template: &str, units_per_item: u64) -> Option<ProgressStyle> {
    let eta = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
        let total = state.len().unwrap_or(0) as f64;
        let _ = w.write_str(&eta_text(state.pos() as f64, total, state.elapsed()));
    };
    let items = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
        let total = state.len().unwrap_or(0) / units_per_item;
        let _ = w.write_str(&steps_text(
            state.pos() * UNITS_PER_STEP / units_per_item,
            total,
        ));
    };
    ProgressStyle::with_template(template)
        .ok()
        .map(|s| s.with_key("eta_est", eta).with_key("items", items))
}

/// A bar over `total` units, or a hidden one when it should not show.
pub fn bar(total: u64, json: bool, what: &str) -> ProgressBar {
    if !visible(json) || total == 0 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Some(style) = style(
        "{msg} [{bar:40}] {human_pos}/{human_len} (eta {eta_est})",
        1,
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A bar over `steps` steps that moves inside each step too: its position
/// is in thousandths of a step ([`UNITS_PER_STEP`]), shown as `3.4/20
/// steps`. Hidden when it should not show.
pub fn steps_bar(steps: u64, json: bool, what: &str) -> ProgressBar {
    if !visible(json) || steps == 0 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps.saturating_mul(UNITS_PER_STEP));
    let template = "{msg} [{bar:40}] {items} steps (eta {eta_est})";
    if let Some(style) = style(template, UNITS_PER_STEP) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A spinner with `message` for a long part that has no count (building a
/// large pod, compiling), drawn on stderr when it is a terminal and the
/// output is not JSON; cleared when done or dropped (an error on the way
/// leaves no stale line).
pub fn spinner(json: bool, message: &str) -> ProgressBar {
    if !visible(json) {
        return ProgressBar::hidden();
    }
    let spinner = ProgressBar::new_spinner().with_finish(indicatif::ProgressFinish::AndClear);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        spinner.set_style(style);
    }
    spinner.set_message(message.to_string());
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    spinner
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eta_is_unknown_until_work_is_done_then_the_rate_so_far() {
        let ten = Duration::from_secs(10);
        assert_eq!(eta(0.0, 20.0, ten), None);
        assert_eq!(eta(1.0, 20.0, Duration::ZERO), None);
        assert_eq!(eta_text(0.0, 20.0, ten), "?");
        // A quarter of one step in 10 s: 79 quarters left at 10 s each.
        assert_eq!(eta(0.25, 20.0, ten), Some(Duration::from_secs(790)));
        assert_eq!(eta_text(0.25, 20.0, ten), "13m 10s");
        assert_eq!(eta_text(10.0, 20.0, ten), "10s");
        assert_eq!(eta_text(20.0, 20.0, ten), "0s");
        assert_eq!(eta_text(1.0, 1000.0, ten), "2h 46m");
    }

    #[test]
    fn a_step_moves_through_its_gradients_then_its_flight() {
        assert_eq!(within_step(StepPart::Gradients, 0.0), 0);
        assert_eq!(within_step(StepPart::Gradients, 0.5), 450);
        assert_eq!(within_step(StepPart::Gradients, 1.0), 900);
        assert_eq!(within_step(StepPart::InFlight, 0.5), 950);
        assert_eq!(within_step(StepPart::InFlight, 1.0), UNITS_PER_STEP - 1);
        assert_eq!(within_step(StepPart::InFlight, f64::NAN), 900);
    }

    #[test]
    fn steps_show_the_step_in_flight_in_tenths() {
        assert_eq!(steps_text(0, 20), "0.0/20");
        assert_eq!(steps_text(3_499, 20), "3.4/20");
        assert_eq!(steps_text(20_000, 20), "20.0/20");
    }
}
