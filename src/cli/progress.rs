//! A progress bar for long commands, on a terminal only.
//!
//! Drawn on stderr, and only when both stdout and stderr are terminals and
//! the output is not JSON: piped or machine-read output stays clean.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A bar over `total` units, or a hidden one when it should not show.
pub fn bar(total: u64, json: bool, what: &str) -> ProgressBar {
    let visible = !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    if !visible || total == 0 {
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
