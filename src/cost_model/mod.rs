//! A sharded step's cost in closed form: time, traffic and HBM from the
//! model's sizes, the mesh and the pod's link figures, with no buffers and
//! no entities, so a 10¹⁸-parameter model on a pod of any size costs
//! microseconds to model.
//!
//! This is what the planner and the step model read. The real sharded run
//! (buffers, the pod's systems, simulated time) is [`crate::sharding`],
//! one layer below; where both compute the same quantity they call one
//! function there — a strategy's bucket plan and HBM by kind
//! ([`crate::sharding::strategy`], [`crate::sharding::residency`]), the
//! update and overlap schedule ([`crate::sharding::timing`]) — and
//! `tests/modeled.rs` holds the run's traffic-charged step equal to the
//! closed form here.
//!
//! * [`replicated`]: the weight-update-sharded (ZeRO-1) step over a torus
//!   and across slices, with the redundant policy's state copies, as the
//!   pod runs it ([`modeled_step`], [`modeled_step_with_recovery`]).
//! * [`strategy`]: any strategy on any mesh ([`modeled_strategy_step`]):
//!   each bucket's collectives on their axes' links, placed on one
//!   communication and one compute stream in the optimizer's order or a
//!   training step's pipelined order, with the strategy's HBM by kind.
//! * The collectives of one mesh axis ([`axis_collective`],
//!   [`axis_all_to_all`], [`axis_permute`]) that the step model charges
//!   for tensor, expert and stage axes.
//!
//! Equal buckets cost the same; the schedules jump over runs of equal work
//! once they repeat (`steady_state`), so modeling cost does not grow with
//! the model (`tests/modeling_cost.rs`).

mod axis_costs;
mod options;
mod pipeline;
pub mod replicated;
mod steady_state;
pub mod strategy;
mod streams;

pub use replicated::{ModeledStep, modeled_step, modeled_step_with_recovery};
pub use strategy::{
    AxisCollective, AxisFigures, BucketSpan, DataReduction, Precision, STEADY_STEPS, SpanKind,
    StepOrder, StrategyOptions, StrategyStep, WideBytes, axis_all_to_all, axis_collective,
    axis_permute, modeled_strategy_step, wide_map,
};
