//! The host's instruction set, probed once per process.

use std::sync::OnceLock;

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};

/// The host's instruction set, detected once (`None`: Cranelift does not
/// support this machine, and every loop is interpreted).
pub(super) fn host_isa() -> Option<&'static OwnedTargetIsa> {
    static ISA: OnceLock<Option<OwnedTargetIsa>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").ok()?;
        flags.set("use_colocated_libcalls", "false").ok()?;
        flags.set("is_pic", "false").ok()?;
        cranelift_native::builder()
            .ok()?
            .finish(settings::Flags::new(flags))
            .ok()
    })
    .as_ref()
}

/// Whether the host has fused multiply-add (the fast `f32` `rsqrt`).
pub(super) fn host_has_fma() -> bool {
    static FMA: OnceLock<bool> = OnceLock::new();
    *FMA.get_or_init(|| {
        host_isa().is_some_and(|isa| {
            isa.isa_flags()
                .iter()
                .any(|f| f.name == "has_fma" && f.as_bool() == Some(true))
        })
    })
}
