//! The host memory a run may use: a model is refused before it is built
//! when its parameters, gradients and state would not fit.

/// Host memory assumed when the available memory cannot be read
/// (`MemAvailable` of `/proc/meminfo` on Linux).
pub const FALLBACK_HOST_BYTES: u128 = 16 << 30;

/// The host memory available now, bytes.
pub fn host_memory_budget() -> u128 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(FALLBACK_HOST_BYTES)
}
