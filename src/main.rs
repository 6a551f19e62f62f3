//! The `optirs-tpu` command-line host. It only parses arguments and calls the
//! library; see `optirs-tpu --help`.
//!
//! Exit codes: 0 success, 1 an error (printed to stderr with its causes),
//! 2 a usage error (an unknown flag, or a bad value for one: every value
//! with a fixed set of names or a range is checked by the parser). A closed
//! stdout (`| head`) exits 0.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
