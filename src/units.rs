//! The one way memory sizes are printed: binary units (`1.27 TiB`,
//! `32.00 GiB`, `512 B`), in every command's text and every message.
//! Bandwidths and rates stay decimal (`GB/s`), as the hardware's figures are
//! published.

/// Formats a byte count with a binary unit: `1.27 TiB`, `512 B` (a
/// model's traffic may pass 2^64 bytes: `10.66 ZiB`).
pub fn bytes(value: impl Into<u128>) -> String {
    let value: u128 = value.into();
    let units = [
        (1u128 << 80, "YiB"),
        (1 << 70, "ZiB"),
        (1 << 60, "EiB"),
        (1 << 50, "PiB"),
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (scale, unit) in units {
        if value >= scale {
            return format!("{:.2} {unit}", value as f64 / scale as f64);
        }
    }
    format!("{value} B")
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(bytes(999u64), "999 B");
        assert_eq!(bytes(1u64 << 30), "1.00 GiB");
        assert_eq!(bytes(95u64 << 30), "95.00 GiB");
        assert_eq!(bytes(1_400_000_000_000u64), "1.27 TiB");
    }
}
