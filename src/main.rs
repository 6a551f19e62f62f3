//! The `optirs-tpu` command-line host. It only parses arguments and calls the
//! library; see `optirs-tpu --help`.
//!
//! Exit codes: 0 success, 1 an error (printed to stderr with its causes),
//! 2 a usage error. A closed stdout (`| head`) exits 0.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
