//! A model's buckets without materializing them: the layout
//! [`super::layout::ShardLayout::new`] builds, in closed form, as runs of
//! equal buckets. The flat model is cut into buckets of `bucket_elements`
//! (the bucket bytes in elements, rounded down to a multiple of the devices,
//! at least one per device) and only the last, shorter one is padded, so a
//! model has at most two bucket lengths, whatever its size: what lets the
//! closed-form step model a 10¹⁸-element model in the time it models a
//! small one.

use serde::Serialize;

use super::error::ShardingError;
use crate::ir::DType;

/// The most elements the closed form models: 2⁶⁰ (1.15·10¹⁸), so every
/// byte count of the model (bytes per element × elements × the few copies a
/// device holds) stays a `u64`.
pub const MAX_MODELED_ELEMENTS: u64 = 1 << 60;

/// A model's buckets as runs of equal padded length, in model order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketRuns {
    /// Elements of the model (unpadded).
    pub elements: usize,
    /// Elements of every bucket but the last (a multiple of the devices).
    pub bucket_elements: usize,
    /// Each run's padded bucket length and its bucket count: the full
    /// buckets, then the shorter last one if its padded length differs.
    pub runs: Vec<(usize, usize)>,
}

impl BucketRuns {
    /// The runs of a model of `tensors` (names and shapes, laid end to end)
    /// of `dtype` in buckets of about `bucket_bytes` over
    /// `devices` devices. Errors: no tensor, an empty one, fewer bucket
    /// bytes than an element, no device, or more than
    /// [`MAX_MODELED_ELEMENTS`] elements.
    pub fn of_tensors(
        tensors: &[(String, Vec<usize>)],
        dtype: DType,
        bucket_bytes: usize,
        devices: usize,
    ) -> Result<BucketRuns, ShardingError> {
        if tensors.is_empty() {
            return Err(ShardingError::EmptyModel);
        }
        let mut elements: u128 = 0;
        for (name, shape) in tensors {
            let len = shape
                .iter()
                .try_fold(1u128, |a, &d| a.checked_mul(d as u128))
                .unwrap_or(u128::MAX);
            if len == 0 {
                return Err(ShardingError::EmptyTensor {
                    name: name.clone(),
                    shape: shape.clone(),
                });
            }
            elements = elements.saturating_add(len);
        }
        if elements > u128::from(MAX_MODELED_ELEMENTS) {
            return Err(ShardingError::TooLargeToModel {
                elements,
                max: MAX_MODELED_ELEMENTS,
            });
        }
        BucketRuns::new(elements as usize, dtype, bucket_bytes, devices)
    }

    /// The runs of `elements` elements (see [`BucketRuns::of_tensors`]).
    pub fn new(
        elements: usize,
        dtype: DType,
        bucket_bytes: usize,
        devices: usize,
    ) -> Result<BucketRuns, ShardingError> {
        if elements == 0 {
            return Err(ShardingError::EmptyModel);
        }
        if elements as u128 > u128::from(MAX_MODELED_ELEMENTS) {
            return Err(ShardingError::TooLargeToModel {
                elements: elements as u128,
                max: MAX_MODELED_ELEMENTS,
            });
        }
        let elem_bytes = dtype.byte_size();
        if bucket_bytes < elem_bytes {
            return Err(ShardingError::BucketBytes {
                bytes: bucket_bytes,
                dtype: dtype.to_string(),
                min: elem_bytes,
            });
        }
        if devices == 0 {
            return Err(ShardingError::Devices {
                reason: "a sharded model needs at least one device".into(),
            });
        }
        let n = devices;
        let bucket_elements = ((bucket_bytes / elem_bytes) / n * n).max(n);
        let full = elements / bucket_elements;
        let rest = elements % bucket_elements;
        let mut runs = Vec::with_capacity(2);
        if full > 0 {
            runs.push((bucket_elements, full));
        }
        if rest > 0 {
            let padded = rest.next_multiple_of(n);
            match runs.last_mut() {
                Some((len, count)) if *len == padded => *count += 1,
                _ => runs.push((padded, 1)),
            }
        }
        Ok(BucketRuns {
            elements,
            bucket_elements,
            runs,
        })
    }

    /// Buckets in all.
    pub fn buckets(&self) -> usize {
        self.runs.iter().map(|r| r.1).sum()
    }

    /// The run bucket `k` belongs to.
    pub fn run_of(&self, k: usize) -> usize {
        let mut first = 0;
        for (i, &(_, count)) in self.runs.iter().enumerate() {
            first += count;
            if k < first {
                return i;
            }
        }
        self.runs.len().saturating_sub(1)
    }

    /// The first bucket of every run.
    pub fn run_starts(&self) -> Vec<usize> {
        let mut first = 0;
        self.runs
            .iter()
            .map(|&(_, count)| {
                let start = first;
                first += count;
                start
            })
            .collect()
    }

    /// The padded flat vector's length: every bucket's padded length.
    pub fn padded_elements(&self) -> usize {
        self.runs.iter().map(|&(len, count)| len * count).sum()
    }

    /// The longest padded bucket.
    pub fn largest(&self) -> usize {
        self.runs.iter().map(|r| r.0).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharding::layout::{ShardLayout, ShardPlan};
    use crate::topology::DeviceId;

    fn layout(sizes: &[usize], bucket_bytes: usize, n: usize) -> ShardLayout {
        let tensors: Vec<(String, Vec<usize>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| (format!("t{i}"), vec![s]))
            .collect();
        ShardLayout::new(
            DType::F32,
            &tensors,
            bucket_bytes,
            (0..n as u32).map(DeviceId).collect(),
            ShardPlan::Torus {
                dims: vec![n],
                wraparound: vec![true],
            },
        )
        .unwrap()
    }

    #[test]
    fn a_huge_model_is_two_runs() {
        let runs = BucketRuns::new(1_000_000_000_000_000_007, DType::F32, 25 << 20, 256).unwrap();
        assert_eq!(runs.runs.len(), 2);
        assert_eq!(runs.buckets(), runs.runs[0].1 + 1);
        assert!(runs.padded_elements() >= runs.elements);
        assert_eq!(runs.run_of(0), 0);
        assert_eq!(runs.run_of(runs.buckets() - 1), 1);
        assert!(matches!(
            BucketRuns::new(usize::MAX, DType::F32, 1 << 20, 16),
            Err(ShardingError::TooLargeToModel { .. })
        ));
        assert!(matches!(
            BucketRuns::new(10, DType::F32, 3, 16),
            Err(ShardingError::BucketBytes { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn runs_are_the_layout_s_buckets(
            sizes in proptest::collection::vec(1usize..5000, 1..6),
            bucket_bytes in 4usize..20_000,
            n in 1usize..40,
        ) {
            let l = layout(&sizes, bucket_bytes, n);
            let tensors: Vec<(String, Vec<usize>)> =
                sizes.iter().map(|&s| ("t".to_string(), vec![s])).collect();
            let runs = BucketRuns::of_tensors(&tensors, DType::F32, bucket_bytes, n).unwrap();
            let expanded: Vec<usize> = runs
                .runs
                .iter()
                .flat_map(|&(len, count)| std::iter::repeat_n(len, count))
                .collect();
            let padded: Vec<usize> = l.buckets.iter().map(|b| b.padded_len).collect();
            proptest::prop_assert_eq!(expanded, padded);
            proptest::prop_assert_eq!(runs.elements, l.elements);
            proptest::prop_assert_eq!(runs.bucket_elements, l.bucket_elements);
            proptest::prop_assert_eq!(runs.padded_elements(), l.padded_elements());
            for k in 0..runs.buckets() {
                let (len, _) = runs.runs[runs.run_of(k)];
                proptest::prop_assert_eq!(len, l.buckets[k].padded_len);
            }
        }
    }
}
