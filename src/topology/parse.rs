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
    let options =
        ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
    let syntax = |field: String, error: ron::error::SpannedError| TopologyError::Syntax {
        origin: origin.to_string(),
        line: error.position.line,
        column: error.position.col,
        field,
        message: error.code.to_string(),
    };
    let mut de = ron::Deserializer::from_str_with_options(text, &options)
        .map_err(|e| syntax("Pod".to_string(), e))?;
    let parsed: Result<PodFile, _> = serde_path_to_error::deserialize(&mut de);
    match parsed {
        Ok(file) => {
            de.end()
                .map_err(|code| syntax("Pod".into(), de.span_error(code)))?;
            Ok(file)
        }
        Err(error) => {
            let path = error.path().to_string();
            let field = if path == "." || path.is_empty() {
                "Pod".to_string()
            } else {
                path
            };
            Err(syntax(field, de.span_error(error.into_inner())))
        }
    }
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
