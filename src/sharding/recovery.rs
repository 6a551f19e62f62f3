//! The participant scans' earlier path, kept for the callers that name it;
//! they live in [`super::participants`], and recovery itself in
//! [`crate::recovery`].

pub use super::participants::{lost_participant, stopped_participant};
