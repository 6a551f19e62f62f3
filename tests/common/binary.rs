//! The `optirs-tpu` binary, run as a user runs it.

use std::process::{Command, Output};

/// Runs `optirs-tpu ARGS` and returns what it printed and its exit status.
pub fn optirs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(args)
        .output()
        .expect("the binary runs")
}
