//! `plan`: the fastest layout of a model on a pod that fits, found by
//! search.
//!
//! A layout is everything a modeled step takes besides the model and the
//! pod ([`Layout`]): the strategy, the mesh on whole torus axes and slices
//! (`data`, `stage`, `fsdp`, `tensor`, `expert`), the remat policy, fsdp's
//! prefetch, when the data axis's all-reduce runs and a pipeline's
//! microbatches and repeats. [`space`] lists them, [`search`] models them
//! with [`crate::step_model`] best-first, pruned by a bound that never
//! drops a layout of the top, and ranks those that fit by their step (the
//! batch is the search's, so a shorter step is more tokens a second a
//! chip). [`effective`] ranks them by their goodput under failures
//! instead, and [`pods`] compares pods by time to train.

pub mod effective;
pub mod pods;
pub mod published;
pub mod search;
pub mod space;

pub use effective::{Effective, plan_by_goodput};
pub use pods::{PodPlan, by_time_to_train};
pub use published::{PublishedRank, rank_published};
pub use search::{Candidate, Plan, PlanRequest, Refusal, options_of, plan};
pub use space::{Layout, SearchSpace, meshes};
