//! Behaviour every built-in optimizer shares, and each rule against a plain
//! scalar reference written independently here.

use ndarray::{Array1, Array2, ArrayD, IxDyn, array};
use proptest::prelude::*;

use super::*;
use crate::Optimizer;
use crate::optimizers::OptimizerError;
use crate::optimizers::{FloatElement, OptimizerState, StateSlot, UpdateKind, UpdateRule};

/// One of each optimizer, behind the two traits, in `UpdateKind::ALL` order.
fn all_f32() -> Vec<Box<dyn Both<f32>>> {
    vec![
        Box::new(SGD::new(0.01f32)),
        Box::new(Momentum::new(0.01f32, 0.9)),
        Box::new(Nesterov::new(0.01f32, 0.9)),
        Box::new(Adam::new(0.01f32)),
        Box::new(AdamW::new(0.01f32, 0.01)),
        Box::new(RMSProp::new(0.01f32)),
        Box::new(Adagrad::new(0.01f32)),
    ]
}

trait Both<A>: Optimizer<A, ndarray::Ix1> + Optimizer<A, ndarray::Ix2> + UpdateRule<A> {}
impl<A, T> Both<A> for T where
    T: Optimizer<A, ndarray::Ix1> + Optimizer<A, ndarray::Ix2> + UpdateRule<A>
{
}

#[test]
fn names_are_the_stable_kind_names() {
    for (opt, kind) in all_f32().iter().zip(UpdateKind::ALL) {
        assert_eq!(opt.update_kind(), kind);
        assert_eq!(
            Optimizer::<f32, ndarray::Ix1>::name(opt.as_ref()),
            kind.as_str()
        );
    }
}

#[test]
fn shape_mismatch_between_params_and_grads_is_an_error() {
    for mut opt in all_f32() {
        let params = Array2::<f32>::zeros((2, 3));
        let grads = Array2::<f32>::zeros((3, 2));
        let err = Optimizer::step(opt.as_mut(), &params, &grads).unwrap_err();
        assert!(
            matches!(err.downcast_ref::<OptimizerError>(), Some(OptimizerError::ShapeMismatch { params, grads }) if params == &[2, 3] && grads == &[3, 2]),
            "{err}"
        );
        assert!(err.to_string().contains("[2, 3]"), "{err}");
        assert!(opt.state().is_none(), "a failed step must not create state");
    }
}

#[test]
fn state_is_keyed_by_the_first_shape_until_reset() {
    let mut adam = Adam::new(0.1f32);
    adam.step(&Array1::<f32>::ones(4), &Array1::<f32>::ones(4))
        .unwrap();
    let err = adam
        .step(&Array1::<f32>::ones(5), &Array1::<f32>::ones(5))
        .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<OptimizerError>(),
            Some(OptimizerError::StateShapeMismatch { .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("reset()"),
        "the error says what to do: {err}"
    );
    assert_eq!(
        adam.state().unwrap().count,
        1,
        "a failed step leaves the count alone"
    );
    adam.reset();
    assert!(adam.state().is_none());
    adam.step(&Array1::<f32>::ones(5), &Array1::<f32>::ones(5))
        .unwrap();
    assert_eq!(adam.state().unwrap().count, 1);
    assert_eq!(adam.state().unwrap().shape(), Some(&[5][..]));

    // No per-element state: SGD takes any shape.
    let mut sgd = SGD::new(0.1f32);
    sgd.step(&Array1::<f32>::ones(4), &Array1::<f32>::ones(4))
        .unwrap();
    sgd.step(&Array1::<f32>::ones(7), &Array1::<f32>::ones(7))
        .unwrap();
    assert_eq!(sgd.state().unwrap().count, 2);
}

#[test]
fn error_messages_name_the_shapes_and_what_to_do() {
    let mut adam = Adam::new(0.1f32);
    let err = adam
        .step(&Array1::<f32>::ones(3), &Array1::<f32>::ones(4))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "params have shape [3] but grads have shape [4]; they must match element for element"
    );
    adam.step(&Array1::<f32>::ones(3), &Array1::<f32>::ones(3))
        .unwrap();
    let err = adam
        .step(&Array2::<f32>::ones((2, 2)), &Array2::<f32>::ones((2, 2)))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "adam: its state has shape [3] but the params have shape [2, 2]; call reset() to \
         start over with the new shape, or use one optimizer per tensor"
    );
}

#[test]
fn boxed_optimizers_are_optimizers() {
    let mut boxed: Box<dyn Optimizer<f32, ndarray::Ix1>> = Box::new(SGD::new(0.5f32));
    let p = boxed.step(&array![1.0f32], &array![1.0f32]).unwrap();
    assert_eq!(p[0], 0.5);
    boxed.set_learning_rate(0.25);
    assert_eq!(boxed.learning_rate(), 0.25);
    assert_eq!(boxed.name(), "sgd");
}

#[test]
fn learning_rate_get_and_set() {
    let mut sgd = SGD::new(0.5f32);
    assert_eq!(sgd.learning_rate(), 0.5);
    sgd.set_learning_rate(0.25);
    assert_eq!(sgd.learning_rate(), 0.25);
    let p = sgd.step(&array![1.0f32], &array![1.0f32]).unwrap();
    assert_eq!(p[0], 0.75);
    for mut opt in all_f32() {
        Optimizer::<f32, ndarray::Ix1>::set_learning_rate(opt.as_mut(), 0.125);
        assert_eq!(
            Optimizer::<f32, ndarray::Ix1>::learning_rate(opt.as_ref()),
            0.125
        );
        assert_eq!(opt.hyper_parameters()[0].name, "learning_rate");
        assert_eq!(opt.hyper_parameters()[0].value, 0.125);
    }
}

#[test]
fn nan_and_inf_in_grads_propagate_without_panicking() {
    for mut opt in all_f32() {
        let params = array![1.0f32, 1.0, 1.0];
        let grads = array![f32::NAN, f32::INFINITY, 0.5];
        let p = Optimizer::step(opt.as_mut(), &params, &grads).unwrap();
        let kind = opt.update_kind();
        assert!(
            p[0].is_nan(),
            "{kind}: NaN grad gives NaN param, got {}",
            p[0]
        );
        assert!(
            !p[1].is_finite(),
            "{kind}: Inf grad gives a non-finite param, got {}",
            p[1]
        );
        assert!(
            p[2].is_finite(),
            "{kind}: other elements are untouched by the NaN"
        );
    }
    let p = SGD::new(0.1f32)
        .step(&array![1.0f32], &array![f32::NEG_INFINITY])
        .unwrap();
    assert_eq!(p[0], f32::INFINITY);
}

#[test]
fn f64_and_any_rank_work() {
    let mut adam = Adam::new(1e-3f64);
    let params = ArrayD::<f64>::ones(IxDyn(&[2, 3, 4]));
    let grads = ArrayD::<f64>::from_elem(IxDyn(&[2, 3, 4]), 0.5);
    let p = adam.step(&params, &grads).unwrap();
    // First Adam step moves every element by lr * g / (|g| + eps) ≈ lr.
    for x in p.iter() {
        assert!((1.0 - x - 1e-3).abs() < 1e-10, "{x}");
    }
    assert_eq!(<f64 as crate::ir::Element>::DTYPE.name(), "f64");
}

#[test]
fn step_in_place_equals_step_including_non_standard_layouts() {
    let base = Array2::from_shape_fn((3, 5), |(i, j)| (i * 5 + j) as f32 * 0.1 - 0.7);
    let grads = Array2::from_shape_fn((5, 3), |(i, j)| ((i + 2 * j) as f32).sin()).reversed_axes();
    assert!(!grads.is_standard_layout());
    let mut fresh = all_f32();
    let mut donated = all_f32();
    for (a, b) in fresh.iter_mut().zip(donated.iter_mut()) {
        let mut p_fresh = base.clone();
        let mut p_donated = base
            .clone()
            .reversed_axes()
            .as_standard_layout()
            .into_owned();
        p_donated = p_donated.reversed_axes();
        assert!(!p_donated.is_standard_layout());
        for _ in 0..3 {
            p_fresh = Optimizer::step(a.as_mut(), &p_fresh, &grads).unwrap();
            Optimizer::step_in_place(b.as_mut(), &mut p_donated, &grads).unwrap();
        }
        assert_eq!(p_fresh, p_donated, "{}", a.update_kind());
        assert_eq!(a.state(), b.state());
    }
}

#[test]
fn parallel_chunks_equal_a_single_pass() {
    // Larger than CHUNK, so the rayon path runs, and than two 2 MiB pages, so
    // the output gets the huge-page advice; compare element by element with
    // the same optimizer stepped on slices smaller than CHUNK, and with the
    // in-place step.
    let n = (1 << 20) + 123;
    let params = Array1::from_shape_fn(n, |i| ((i % 997) as f32 - 498.0) * 1e-3);
    let grads = Array1::from_shape_fn(n, |i| ((i % 89) as f32 - 44.0) * 1e-2);
    for (mut whole, mut piecewise) in all_f32().into_iter().zip(all_f32()) {
        let big = Optimizer::step(whole.as_mut(), &params, &grads).unwrap();
        let mut donated = params.clone();
        Optimizer::reset(whole.as_mut() as &mut dyn Optimizer<f32, ndarray::Ix1>);
        Optimizer::step_in_place(whole.as_mut(), &mut donated, &grads).unwrap();
        assert_eq!(big, donated, "{}", whole.update_kind());
        let mut pieces = Vec::with_capacity(n);
        for start in (0..n).step_by(CHUNK / 2) {
            let end = (start + CHUNK / 2).min(n);
            let p = params.slice(ndarray::s![start..end]).to_owned();
            let g = grads.slice(ndarray::s![start..end]).to_owned();
            Optimizer::reset(piecewise.as_mut() as &mut dyn Optimizer<f32, ndarray::Ix1>);
            pieces.extend(Optimizer::step(piecewise.as_mut(), &p, &g).unwrap());
        }
        assert!(
            big.iter()
                .zip(&pieces)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}",
            whole.update_kind()
        );
    }
}

#[test]
fn set_state_validates_names_shapes_and_count() {
    let mut adam = Adam::new(0.1f32);
    let slot = |name, n| StateSlot {
        name,
        value: ArrayD::<f32>::zeros(IxDyn(&[n])),
    };
    let bad_names = OptimizerState {
        count: 0,
        slots: vec![slot("nu", 3), slot("mu", 3)],
    };
    assert!(matches!(
        adam.set_state(bad_names)
            .unwrap_err()
            .downcast_ref::<OptimizerError>(),
        Some(OptimizerError::InvalidState { .. })
    ));
    let bad_shapes = OptimizerState {
        count: 0,
        slots: vec![slot("mu", 3), slot("nu", 4)],
    };
    assert!(matches!(
        adam.set_state(bad_shapes)
            .unwrap_err()
            .downcast_ref::<OptimizerError>(),
        Some(OptimizerError::InvalidState { .. })
    ));
    let bad_count = OptimizerState {
        count: -1,
        slots: vec![slot("mu", 3), slot("nu", 3)],
    };
    assert!(matches!(
        adam.set_state(bad_count)
            .unwrap_err()
            .downcast_ref::<OptimizerError>(),
        Some(OptimizerError::InvalidState { .. })
    ));
    assert!(adam.state().is_none());

    // A round trip through state()/set_state() continues the trajectory.
    let (p0, g) = (array![0.5f32, -1.0, 2.0], array![0.1f32, 0.2, -0.3]);
    let mut a = Adam::new(0.1f32);
    let p1 = a.step(&p0, &g).unwrap();
    let mut b = Adam::new(0.1f32);
    b.set_state(a.state().unwrap().clone()).unwrap();
    assert_eq!(a.step(&p1, &g).unwrap(), b.step(&p1, &g).unwrap());
    assert_eq!(a.state().unwrap().count, 2);

    // take_state moves it out and leaves the optimizer reset.
    let taken = a.take_state().unwrap();
    assert!(a.state().is_none());
    assert_eq!(taken.count, 2);
    a.set_state(taken).unwrap();
    assert_eq!(a.state().unwrap().count, 2);
}

#[test]
fn count_saturates_at_i32_max() {
    let mut adam = Adam::new(0.1f32);
    let slot = |name| StateSlot {
        name,
        value: ArrayD::<f32>::zeros(IxDyn(&[1])),
    };
    adam.set_state(OptimizerState {
        count: i32::MAX,
        slots: vec![slot("mu"), slot("nu")],
    })
    .unwrap();
    let p = adam.step(&array![1.0f32], &array![1.0f32]).unwrap();
    assert_eq!(adam.state().unwrap().count, i32::MAX);
    assert!(p[0].is_finite());
}

#[test]
fn constants_are_rounded_once_from_f64() {
    // optax rounds 1 - 0.9 computed in double: 0.09999999999999998 -> 0.1f32,
    // not 1 - 0.9f32 = 0.100000024; likewise 1 - 0.999 -> 0.001f32, not
    // 1 - 0.999f32 = 0.0009999871.
    let c = Adam::new(1e-3f32).constants(1);
    assert_eq!(c.one_minus_b1, 0.1f32);
    assert_eq!(c.one_minus_b2.to_bits(), 0.001f32.to_bits());
    assert_eq!(c.eps.to_bits(), 1e-8f32.to_bits());
    assert_eq!(c.neg_lr.to_bits(), (-0.001f32).to_bits());
    assert_eq!(AdamW::new(1e-3f32, 0.01).constants(1).weight_decay, 0.01f32);
}

/// Scalar references, one element at a time, in plain f32 arithmetic.
mod reference {
    pub fn pow(b: f32, t: i32) -> f32 {
        f64::from(b).powi(t) as f32
    }

    pub fn rsqrt(x: f32) -> f32 {
        (1.0 / f64::from(x).sqrt()) as f32
    }

    /// Returns (param, slot0, slot1) after `steps` of `rule` from zero-ish state.
    pub fn run(rule: &str, hp: &[f64], p0: f32, grads: &[f32]) -> (f32, f32, f32) {
        let lr = hp[0] as f32;
        let (mut p, mut a, mut b) = (p0, 0.0f32, 0.0f32);
        if rule == "rmsprop" {
            a = hp[3] as f32;
        }
        if rule == "adagrad" {
            a = hp[1] as f32;
        }
        for (k, &g) in grads.iter().enumerate() {
            let t = k as i32 + 1;
            let d = match rule {
                "sgd" => g,
                "momentum" => {
                    a = g + (hp[1] as f32) * a;
                    a
                }
                "nesterov" => {
                    a = g + (hp[1] as f32) * a;
                    g + (hp[1] as f32) * a
                }
                "adam" | "adamw" => {
                    let (b1, b2) = (hp[1] as f32, hp[2] as f32);
                    a = ((1.0 - hp[1]) as f32) * g + b1 * a;
                    b = ((1.0 - hp[2]) as f32) * (g * g) + b2 * b;
                    let mh = a * (1.0 / (1.0 - pow(b1, t)));
                    let nh = b * (1.0 / (1.0 - pow(b2, t)));
                    let d = mh / ((nh + hp[4] as f32).sqrt() + hp[3] as f32);
                    if rule == "adamw" {
                        d + (hp[5] as f32) * p
                    } else {
                        d
                    }
                }
                "rmsprop" => {
                    a = ((1.0 - hp[1]) as f32) * (g * g) + (hp[1] as f32) * a;
                    g * rsqrt(a + hp[2] as f32)
                }
                "adagrad" => {
                    a += g * g;
                    let s = if a > 0.0 {
                        rsqrt(a + hp[2] as f32)
                    } else {
                        0.0
                    };
                    s * g
                }
                _ => unreachable!("unknown rule {rule}"),
            };
            p += (-lr) * d;
        }
        (p, a, b)
    }
}

fn build(kind: UpdateKind, hp: &[f64]) -> Box<dyn Both<f32>> {
    let lr = hp[0] as f32;
    match kind {
        UpdateKind::Sgd => Box::new(SGD::new(lr)),
        UpdateKind::Momentum => Box::new(Momentum::new(lr, hp[1])),
        UpdateKind::Nesterov => Box::new(Nesterov::new(lr, hp[1])),
        UpdateKind::Adam => Box::new(
            Adam::new(lr)
                .with_betas(hp[1], hp[2])
                .with_eps(hp[3])
                .with_eps_root(hp[4]),
        ),
        UpdateKind::AdamW => Box::new(
            AdamW::new(lr, 0.0)
                .with_betas(hp[1], hp[2])
                .with_eps(hp[3])
                .with_eps_root(hp[4])
                .with_weight_decay(hp[5]),
        ),
        UpdateKind::RmsProp => Box::new(
            RMSProp::new(lr)
                .with_decay(hp[1])
                .with_eps(hp[2])
                .with_initial_scale(hp[3]),
        ),
        UpdateKind::Adagrad => Box::new(
            Adagrad::new(lr)
                .with_initial_accumulator_value(hp[1])
                .with_eps(hp[2]),
        ),
    }
}

/// Hyper-parameters in the order `reference::run` and `build` read them.
fn hyper_parameters(kind: UpdateKind) -> BoxedStrategy<Vec<f64>> {
    let lr = 1e-4f64..0.5;
    match kind {
        UpdateKind::Sgd => lr.prop_map(|lr| vec![lr]).boxed(),
        UpdateKind::Momentum | UpdateKind::Nesterov => (lr, 0.0f64..0.999)
            .prop_map(|(lr, mu)| vec![lr, mu])
            .boxed(),
        UpdateKind::Adam | UpdateKind::AdamW => (
            lr,
            0.0f64..0.99,
            0.9f64..0.9999,
            1e-10f64..1e-3,
            prop_oneof![Just(0.0), 1e-12f64..1e-6],
            0.0f64..0.1,
        )
            .prop_map(|(lr, b1, b2, eps, eps_root, wd)| vec![lr, b1, b2, eps, eps_root, wd])
            .boxed(),
        UpdateKind::RmsProp => (
            lr,
            0.5f64..0.999,
            1e-10f64..1e-3,
            prop_oneof![Just(0.0), 0.0f64..1.0],
        )
            .prop_map(|(lr, decay, eps, init)| vec![lr, decay, eps, init])
            .boxed(),
        UpdateKind::Adagrad => (lr, 0.0f64..1.0, 1e-10f64..1e-3)
            .prop_map(|(lr, init, eps)| vec![lr, init, eps])
            .boxed(),
    }
}

fn case() -> impl Strategy<Value = (UpdateKind, Vec<f64>, Vec<f32>, Vec<Vec<f32>>)> {
    (0..UpdateKind::ALL.len(), 0usize..40, 1usize..5).prop_flat_map(|(k, n, steps)| {
        let kind = UpdateKind::ALL[k];
        (
            Just(kind),
            hyper_parameters(kind),
            prop::collection::vec(-10.0f32..10.0, n),
            prop::collection::vec(prop::collection::vec(-10.0f32..10.0, n), steps),
        )
    })
}

proptest! {
    #[test]
    fn every_rule_equals_its_scalar_reference((kind, hp, p0, grads) in case()) {
        let mut opt = build(kind, &hp);
        let mut p = Array1::from(p0.clone());
        for g in &grads {
            p = Optimizer::step(opt.as_mut(), &p, &Array1::from(g.clone())).unwrap();
        }
        let state = opt.state().unwrap();
        prop_assert_eq!(state.count, grads.len() as i32);
        for i in 0..p0.len() {
            let gs: Vec<f32> = grads.iter().map(|g| g[i]).collect();
            let (want_p, want_a, want_b) = reference::run(kind.as_str(), &hp, p0[i], &gs);
            prop_assert_eq!(p[i].to_bits(), want_p.to_bits(), "{} param {}: {} vs {}", kind, i, p[i], want_p);
            if let Some(slot) = state.slots.first() {
                prop_assert_eq!(slot.value[[i]].to_bits(), want_a.to_bits(), "{} {}", kind, slot.name);
            }
            if let Some(slot) = state.slots.get(1) {
                prop_assert_eq!(slot.value[[i]].to_bits(), want_b.to_bits(), "{} {}", kind, slot.name);
            }
        }
    }
}

/// Exhaustive over every positive normal f32 mantissa in two binades (which
/// covers both exponent parities, the only thing sqrt depends on besides the
/// mantissa): `FloatElement::rsqrt` is the correctly rounded 1/sqrt(x).
/// Checked exactly in integers: r is correct iff the rounding boundaries
/// r ± ulp/2 bracket 1/sqrt(x), i.e. (r - h)^2 x < 1 < (r + h)^2 x.
#[test]
#[ignore = "exhaustive, about 16.7M inputs; run with --ignored in release"]
fn rsqrt_f32_is_correctly_rounded() {
    for bits in 0x3f80_0000u32..0x4080_0000 {
        let x = f32::from_bits(bits);
        let r = x.rsqrt();
        // x = mx * 2^ex, r = mr * 2^er with 24-bit integer mantissas.
        let (mx, ex) = (
            u128::from((bits & 0x7f_ffff) | 0x80_0000),
            ((bits >> 23) as i32) - 150,
        );
        let rb = r.to_bits();
        let (mr, er) = (
            u128::from((rb & 0x7f_ffff) | 0x80_0000),
            ((rb >> 23) as i32) - 150,
        );
        // (2 mr ± 1)^2 * mx * 2^(2 er - 2 + ex) compared with 1.
        let shift = 2 * er - 2 + ex;
        assert!(shift < 0, "x = {x}");
        let one = 1u128 << (-shift) as u32;
        let lo = (2 * mr - 1) * (2 * mr - 1) * mx;
        let hi = (2 * mr + 1) * (2 * mr + 1) * mx;
        assert!(
            lo < one && one < hi,
            "rsqrt({x:e}) = {r:e} is not correctly rounded"
        );
    }
}

/// `b^1, b^2, ...` rounded exactly: b = m * 2^e with a 24-bit m, so
/// b^t = m^t * 2^(e t) is kept as a big integer and rounded to 24 bits,
/// nearest-even. Yields `None` once a power is no longer a normal f32.
struct ExactPowers {
    m: u32,
    e: i64,
    t: i64,
    big: Vec<u32>,
}

impl ExactPowers {
    fn new(b: f32) -> Self {
        let bits = b.to_bits();
        let (m, e) = ((bits & 0x7f_ffff) | 0x80_0000, ((bits >> 23) as i64) - 150);
        Self {
            m,
            e,
            t: 0,
            big: vec![1],
        }
    }

    fn next_power(&mut self) -> Option<f32> {
        self.t += 1;
        let mut carry = 0u64;
        for limb in &mut self.big {
            let x = u64::from(*limb) * u64::from(self.m) + carry;
            *limb = x as u32;
            carry = x >> 32;
        }
        if carry > 0 {
            self.big.push(carry as u32);
        }
        let big = &self.big;
        let top = big.len() - 1;
        let len = top as i64 * 32 + (32 - i64::from(big[top].leading_zeros()));
        let bit = |i: i64| i >= 0 && (big[(i / 32) as usize] >> (i % 32)) & 1 == 1;
        let mut mantissa: u64 = (0..24).fold(0, |acc, k| (acc << 1) | u64::from(bit(len - 1 - k)));
        let round = bit(len - 25);
        let sticky = (0..len - 25).any(bit);
        if round && (sticky || mantissa & 1 == 1) {
            mantissa += 1;
        }
        let exponent = len - 24 + self.e * self.t;
        let value = mantissa as f64 * 2f64.powi(exponent as i32);
        (value >= f64::from(f32::MIN_POSITIVE)).then_some(value as f32)
    }
}

/// `FloatElement::pow_rounded` is the correctly rounded f32 `b^t` for the
/// default decay rates, over every count whose power is a normal f32 and
/// whose `1 - b^t` still differs from 1 (beyond that `b^t` cannot change the
/// bias correction).
#[test]
#[ignore = "big-integer powers up to t = 20000; run with --ignored in release"]
fn pow_f32_is_correctly_rounded_for_default_betas() {
    for (b, at_least) in [(0.9f32, 150), (0.99, 1_500), (0.999, 15_000)] {
        let mut exact_powers = ExactPowers::new(b);
        let mut checked = 0;
        for t in 1..=20_000 {
            let Some(exact) = exact_powers.next_power() else {
                break;
            };
            let got = b.pow_rounded(t);
            assert_eq!(
                got.to_bits(),
                exact.to_bits(),
                "{b}^{t}: got {got:e}, exact {exact:e}"
            );
            checked = t;
            if 1.0f32 - exact == 1.0 {
                break;
            }
        }
        assert!(checked >= at_least, "{b}: only {checked} powers checked");
    }
}

#[test]
fn exact_pow_reference_is_sane() {
    let mut half = ExactPowers::new(0.5);
    let powers: Vec<_> = (0..3).map(|_| half.next_power()).collect();
    assert_eq!(powers, [Some(0.5), Some(0.25), Some(0.125)]);
    let mut b = ExactPowers::new(0.9);
    assert_eq!(b.next_power(), Some(0.9));
    assert_eq!(b.next_power(), Some(0.9f32 * 0.9f32));
}

/// Random state values a slot can hold: any sign for `trace`, non-negative
/// for accumulators of squares.
fn slot_value(name: &'static str) -> BoxedStrategy<f32> {
    if name == "trace" || name == "mu" {
        (-10.0f32..10.0).boxed()
    } else {
        (0.0f32..10.0).boxed()
    }
}

/// (param, grad, old slot values) of one element.
type Element = (f32, f32, Vec<f32>);

fn program_case() -> impl Strategy<Value = (UpdateKind, Vec<f64>, i32, Vec<Element>)> {
    (0..UpdateKind::ALL.len(), 0usize..24, 0i32..5000).prop_flat_map(|(k, n, count)| {
        let kind = UpdateKind::ALL[k];
        let names = build(kind, &[0.1, 0.5, 0.9, 1e-8, 0.0, 0.01]).slot_names();
        let slots: Vec<_> = names.iter().map(|&name| slot_value(name)).collect();
        (
            Just(kind),
            hyper_parameters(kind),
            Just(count),
            prop::collection::vec((-10.0f32..10.0, -10.0f32..10.0, slots), n),
        )
    })
}

proptest! {
    /// `update_program(count)`, interpreted one element at a time, is the
    /// step with that count, bit for bit, for the new params and the state.
    #[test]
    fn update_program_equals_step((kind, hp, count, elements) in program_case()) {
        let mut opt = build(kind, &hp);
        let names = opt.slot_names();
        let n = elements.len();
        let slots = names
            .iter()
            .enumerate()
            .map(|(k, &name)| StateSlot {
                name,
                value: ArrayD::from_shape_vec(IxDyn(&[n]), elements.iter().map(|e| e.2[k]).collect())
                    .unwrap(),
            })
            .collect();
        opt.set_state(OptimizerState { count, slots }).unwrap();
        let params = Array1::from_iter(elements.iter().map(|e| e.0));
        let grads = Array1::from_iter(elements.iter().map(|e| e.1));
        let program = opt.update_program(count + 1);
        let stepped = Optimizer::step(opt.as_mut(), &params, &grads).unwrap();
        let state = opt.state().unwrap();
        for (i, (p, g, old)) in elements.iter().enumerate() {
            let (want_p, want_slots) = program.eval(*p, *g, old);
            prop_assert_eq!(stepped[i].to_bits(), want_p.to_bits(), "{} param {}", kind, i);
            for (slot, want) in state.slots.iter().zip(&want_slots) {
                prop_assert_eq!(slot.value[[i]].to_bits(), want.to_bits(), "{} {} {}", kind, slot.name, i);
            }
        }
    }
}

#[test]
fn update_programs_name_their_scalars() {
    let program = Adam::new(1e-3f32).update_program(1);
    let names: Vec<_> = program.constants.iter().map(|c| c.0).collect();
    assert!(
        names.contains(&"inv_bias_correction1") && names.contains(&"neg_lr"),
        "{names:?}"
    );
    assert_eq!(program.new_slots.len(), 2);
    let sgd = SGD::new(0.5f32).update_program(1);
    assert_eq!(sgd.eval(1.0, 1.0, &[]), (0.5, vec![]));
}
