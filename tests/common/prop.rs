//! Helpers of the property tests: case counts and a tiny deterministic
//! generator for inputs.

#![allow(dead_code, reason = "each test file uses a subset")]

/// Case count: `PROPTEST_CASES` when set (for deeper local runs), else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Successive xorshift64 states from `seed` (never zero).
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// One tensor per type, each element `value(type, random)` in row-major
/// order, from the xorshift stream of `seed`.
pub fn random_tensors(
    types: &[optirs_tpu::xla::TensorType],
    seed: u64,
    mut value: impl FnMut(&optirs_tpu::xla::TensorType, u64) -> f64,
) -> Vec<optirs_tpu::exec::kernels::Tensor> {
    let mut next = xorshift(seed);
    types
        .iter()
        .map(|t| {
            let vals: Vec<f64> = (0..t.element_count()).map(|_| value(t, next())).collect();
            optirs_tpu::exec::kernels::Tensor::from_f64s(t, &vals).unwrap()
        })
        .collect()
}
