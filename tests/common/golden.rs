//! The optimizer a golden case describes, shared by the tests that replay
//! `tests/data/optimizers.json` (against `step` and against `tpu_step`).

use serde_json::Value;

/// A hyper-parameter of a golden case.
pub fn hp(case: &Value, name: &str) -> f64 {
    case["hyperparameters"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("hyperparameter {name}"))
}

/// The optimizer of golden `case` with learning rate `lr`, boxed as the
/// surrounding function's return type asks (each arm coerces to it).
macro_rules! golden_optimizer {
    ($case:expr, $lr:expr) => {{
        use optirs_tpu::optimizers::{Adagrad, Adam, AdamW, Momentum, Nesterov, RMSProp, SGD};
        let case: &serde_json::Value = $case;
        let lr = $lr;
        let hp = |name: &str| $crate::common::golden::hp(case, name);
        match case["optimizer"].as_str().expect("optimizer name") {
            "sgd" => Box::new(SGD::new(lr)),
            "momentum" => Box::new(Momentum::new(lr, hp("momentum"))),
            "nesterov" => Box::new(Nesterov::new(lr, hp("momentum"))),
            "adam" => Box::new(
                Adam::new(lr)
                    .with_betas(hp("b1"), hp("b2"))
                    .with_eps(hp("eps"))
                    .with_eps_root(hp("eps_root")),
            ),
            "adamw" => Box::new(
                AdamW::new(lr, hp("weight_decay"))
                    .with_betas(hp("b1"), hp("b2"))
                    .with_eps(hp("eps"))
                    .with_eps_root(hp("eps_root")),
            ),
            "rmsprop" => Box::new(
                RMSProp::new(lr)
                    .with_decay(hp("decay"))
                    .with_eps(hp("eps"))
                    .with_initial_scale(hp("initial_scale")),
            ),
            "adagrad" => Box::new(
                Adagrad::new(lr)
                    .with_initial_accumulator_value(hp("initial_accumulator_value"))
                    .with_eps(hp("eps")),
            ),
            other => panic!("unknown optimizer {other} in golden file"),
        }
    }};
}
pub(crate) use golden_optimizer;
