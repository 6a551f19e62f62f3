//! Pod file text → [`PodFile`]: syntax errors carry the origin, line, column
//! and field (through `serde_path_to_error` over ron's deserializer).

use super::error::TopologyError;
use super::model::Topology;
use super::schema::PodFile;
use super::validate::resolve;

/// Parses and validates pod file text. `origin` names the source in errors.
pub fn parse_topology(text: &str, origin: &str) -> Result<Topology, TopologyError> {
    let file = parse_pod_file(text, origin)?;
    resolve(&file, text, origin)
}

/// Parses pod file text without validating it.
pub fn parse_pod_file(text: &str, origin: &str) -> Result<PodFile, TopologyError> {
    crate::files::parse_ron(text, "Pod").map_err(|e| TopologyError::Syntax {
        origin: origin.to_string(),
        line: e.line,
        column: e.column,
        field: e.field,
        message: e.message,
    })
}

/// The 1-based line of a field's first appearance in `text`, best effort.
///
/// `extra_links[2].a` is found by its top-level key `extra_links`.
pub(super) fn line_of_field(text: &str, field: &str) -> Option<usize> {
    let key = field.split(['.', '[']).next().filter(|k| !k.is_empty())?;
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            !line.starts_with("//")
                && line
                    .strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}
