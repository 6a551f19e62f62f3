//! The bundled pod presets, compiled into the binary from `assets/pods/`.
//!
//! Preset names count **chips**: `v4-64` is 64 chips (a 4x4x4 cube). Google
//! Cloud's accelerator types count TensorCores for v2, v3, v4, v5p and
//! TPU7x, so the same slice is sold as `v4-128`; each preset's description
//! names its Cloud type.

/// `(name, RON text)` of every preset, smallest generation first.
pub const PRESETS: &[(&str, &str)] = &[
    ("v2-8", include_str!("../../assets/pods/v2-8.ron")),
    ("v3-32", include_str!("../../assets/pods/v3-32.ron")),
    ("v4-8", include_str!("../../assets/pods/v4-8.ron")),
    ("v4-64", include_str!("../../assets/pods/v4-64.ron")),
    ("v4-4096", include_str!("../../assets/pods/v4-4096.ron")),
    ("v5e-16", include_str!("../../assets/pods/v5e-16.ron")),
    ("v5e-256", include_str!("../../assets/pods/v5e-256.ron")),
    ("v5p-128", include_str!("../../assets/pods/v5p-128.ron")),
    ("v6e-256", include_str!("../../assets/pods/v6e-256.ron")),
    ("tpu7x-256", include_str!("../../assets/pods/tpu7x-256.ron")),
];

/// The pod `optirs-tpu run` uses when none is named.
pub const DEFAULT_PRESET: &str = "v5e-16";

/// The RON text of a preset.
pub fn preset_text(name: &str) -> Option<&'static str> {
    PRESETS
        .iter()
        .find(|(preset, _)| *preset == name)
        .map(|(_, text)| *text)
}

/// Preset names, comma-separated, for error messages.
pub fn preset_names() -> String {
    PRESETS
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}
