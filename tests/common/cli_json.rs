//! A command's one JSON report, and a usage error's exit code and line, as
//! the command-line tests of the modeled step and the planner read them.

use crate::binary::optirs;
use serde_json::Value;

/// `optirs-tpu ARGS`'s JSON report; the command must succeed.
pub fn json(args: &[&str]) -> Value {
    let out = optirs(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON value")
}

/// Exit code 2, `needle` in the error, no panic; the error's text.
pub fn usage_error(args: &[&str], needle: &str) -> String {
    let out = optirs(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: `{needle}` not in {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}
