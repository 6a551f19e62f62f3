//! A progress bar for long commands, on a terminal only.
//!
//! Drawn on stderr, and only when both stdout and stderr are terminals and
//! the output is not JSON: piped or machine-read output stays clean.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// Whether progress should be drawn: a person is watching both streams
/// and the output is not JSON.
fn visible(json: bool) -> bool {
    !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// A bar over `total` units, or a hidden one when it should not show.
pub fn bar(total: u64, json: bool, what: &str) -> ProgressBar {
    if !visible(json) || total == 0 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {human_pos}/{human_len} (eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A spinner with the elapsed time, for work that cannot say how far it
/// got (one library call); hidden when progress should not show. It
/// redraws itself from its own thread until finished.
pub fn spinner(json: bool, what: &str) -> ProgressBar {
    if !visible(json) {
        return ProgressBar::hidden();
    }
    let spinner = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        spinner.set_style(style);
    }
    spinner.set_message(what.to_string());
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    spinner
}
