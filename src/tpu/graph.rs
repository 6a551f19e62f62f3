//! An optimizer's update as a compiler graph: the builder lives in
//! [`crate::exec::update_graph`], below the sharded optimizer that compiles
//! it; this path keeps the seed's name.

pub use crate::exec::update_graph::*;
