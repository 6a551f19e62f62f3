//! The `optirs-tpu` command-line host. It only parses arguments and calls the
//! library; see `optirs-tpu --help`.
//!
//! Exit codes: 0 success, 1 a runtime failure, 2 a usage error (an
//! unknown name, a bad value, a missing or unwritable path, an unsupported
//! combination), each one `error:` line on stderr; the README's table
//! says which is which. A closed stdout (`| head`) exits 0.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
