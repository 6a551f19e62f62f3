//! The crate's modules are layers: a module imports only modules of lower
//! layers, so no two top-level modules import each other, directly or in a
//! circle.
//!
//! The table is the one in the crate docs (`src/lib.rs`, "Layers"): this
//! test reads it from there, reads every file under `src/`, lists each
//! `crate::…` path outside unit tests (from a file's first `#[cfg(test)]` on,
//! and files that are themselves `#[cfg(test)] mod …;`), and fails naming the
//! file and the import that points up the table or sideways within a layer.
//! A new top-level module must be added to the table.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Layer of each top-level module, from the table in the crate docs.
fn layer_table(lib_rs: &str) -> Result<BTreeMap<String, usize>, String> {
    let mut layers = BTreeMap::new();
    for line in lib_rs.lines() {
        let Some(row) = line.strip_prefix("//! |") else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(layer) = cells
            .first()
            .and_then(|c| c.split_whitespace().next())
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let modules = cells
            .get(1)
            .ok_or_else(|| format!("layer {layer} has no modules"))?;
        for name in modules.split(',') {
            let name = name.trim().trim_matches('`');
            if name.is_empty() {
                continue;
            }
            if let Some(previous) = layers.insert(name.to_string(), layer) {
                return Err(format!(
                    "`{name}` is listed in layers {previous} and {layer} of the table"
                ));
            }
        }
    }
    if layers.is_empty() {
        return Err("src/lib.rs has no layer table (`//! | 0 … | `module`, … |`)".into());
    }
    Ok(layers)
}

/// One source file: its path (for messages), its top-level module, its text.
struct Source {
    path: String,
    module: String,
    text: String,
}

fn read_sources(src: &Path) -> Vec<Source> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(src).unwrap();
            let first = rel.components().next()?.as_os_str().to_str()?.to_string();
            if rel.components().count() == 1 && (first == "lib.rs" || first == "main.rs") {
                return None;
            }
            let module = first.strip_suffix(".rs").unwrap_or(&first).to_string();
            Some(Source {
                path: format!("src/{}", rel.display()),
                module,
                text: fs::read_to_string(&path).unwrap(),
            })
        })
        .collect()
}

/// The text a file contributes to the crate outside its unit tests, without
/// comments.
fn non_test_code(text: &str) -> String {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    match code.find("#[cfg(test)]") {
        Some(i) => code[..i].to_string(),
        None => code,
    }
}

/// Files that are unit-test modules (`#[cfg(test)] mod name;` in their
/// parent), by path.
fn test_module_files(sources: &[Source]) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    for source in sources {
        let lines: Vec<&str> = source.text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            if pair[0] != "#[cfg(test)]" {
                continue;
            }
            let Some(name) = pair[1]
                .strip_prefix("mod ")
                .and_then(|r| r.strip_suffix(';'))
            else {
                continue;
            };
            let dir = match source.path.rsplit_once('/') {
                Some((dir, "mod.rs")) => dir.to_string(),
                Some((dir, file)) => format!("{dir}/{}", file.trim_end_matches(".rs")),
                None => continue,
            };
            files.insert(format!("{dir}/{name}.rs"));
            files.insert(format!("{dir}/{name}/mod.rs"));
        }
    }
    files
}

/// `#[macro_export]` macros live at the crate root; they belong to the
/// module that defines them.
fn exported_macros(sources: &[Source]) -> BTreeMap<String, String> {
    let mut macros = BTreeMap::new();
    for source in sources {
        let lines: Vec<&str> = source.text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            if pair[0] == "#[macro_export]"
                && let Some(rest) = pair[1].strip_prefix("macro_rules! ")
            {
                let name = rest.trim_end_matches(['{', ' ', '(']);
                macros.insert(name.to_string(), source.module.clone());
            }
        }
    }
    macros
}

/// Every top-level module a piece of code names through `crate::`, with the
/// path as written (for the message).
fn crate_imports(code: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        let start = from + at;
        from = start + "crate::".len();
        let preceded_by_ident = start > 0
            && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_')
            && !code[..start].ends_with('$');
        if preceded_by_ident {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::B, c};`: every top-level name of the group.
            let mut depth = 0usize;
            let mut item = String::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        push_group_item(&mut found, &item);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(ch);
            }
            push_group_item(&mut found, &item);
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(*c, '_' | ':'))
                .collect();
            found.push((name, format!("crate::{path}")));
        }
    }
    found
}

fn push_group_item(found: &mut Vec<(String, String)>, item: &str) {
    let item = item.trim();
    let name: String = item
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if !name.is_empty() && name != "self" {
        found.push((
            name,
            format!("crate::{{{}}}", item.split_whitespace().collect::<String>()),
        ));
    }
}

/// Names `src/lib.rs` re-exports at the crate root (`pub use pod::Pod;`),
/// by the module they come from.
fn root_reexports(lib_rs: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in lib_rs.lines() {
        let Some(path) = line
            .trim()
            .strip_prefix("pub use ")
            .and_then(|r| r.strip_suffix(';'))
        else {
            continue;
        };
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        let items = rest.rsplit("::").next().unwrap_or(rest);
        for item in items.trim_matches(['{', '}']).split(',') {
            let item = item.trim();
            let name = item.rsplit(" as ").next().unwrap_or(item).trim();
            if !name.is_empty() {
                names.insert(name.to_string(), module.to_string());
            }
        }
    }
    names
}

/// Every violation of the table in `sources`.
fn violations(
    sources: &[Source],
    layers: &BTreeMap<String, usize>,
    root: &BTreeMap<String, String>,
) -> Vec<String> {
    let tests = test_module_files(sources);
    let mut macros = exported_macros(sources);
    macros.extend(root.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut problems = Vec::new();
    let modules: BTreeSet<&str> = sources.iter().map(|s| s.module.as_str()).collect();
    for module in &modules {
        if !layers.contains_key(*module) {
            problems.push(format!(
                "top-level module `{module}` is not in the layer table of src/lib.rs: add it"
            ));
        }
    }
    for name in layers.keys() {
        if !modules.contains(name.as_str()) {
            problems.push(format!(
                "the layer table lists `{name}`, which is not a module under src/"
            ));
        }
    }
    for source in sources {
        if tests.contains(&source.path) {
            continue;
        }
        let Some(&own) = layers.get(&source.module) else {
            continue;
        };
        let mut seen = BTreeSet::new();
        for (name, path) in crate_imports(&non_test_code(&source.text)) {
            let target = macros.get(&name).cloned().unwrap_or(name);
            if target == source.module || !seen.insert((target.clone(), path.clone())) {
                continue;
            }
            let Some(&theirs) = layers.get(&target) else {
                problems.push(format!(
                    "{}: `{path}` names `{target}`, which is not in the layer table",
                    source.path
                ));
                continue;
            };
            if theirs > own {
                problems.push(format!(
                    "{}: `{path}` points up the table: `{}` (layer {own}) may not import \
                     `{target}` (layer {theirs})",
                    source.path, source.module
                ));
            } else if theirs == own {
                problems.push(format!(
                    "{}: `{path}` stays within layer {own}: `{}` and `{target}` are \
                     neighbours and may not import each other",
                    source.path, source.module
                ));
            }
        }
    }
    problems
}

#[test]
fn no_module_imports_upward_or_sideways() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let layers = layer_table(&lib).unwrap();
    let sources = read_sources(&root.join("src"));
    let problems = violations(&sources, &layers, &root_reexports(&lib));
    assert!(
        problems.is_empty(),
        "the module layers are broken:\n  {}",
        problems.join("\n  ")
    );
}

fn source(path: &str, text: &str) -> Source {
    let module = path
        .trim_start_matches("src/")
        .split('/')
        .next()
        .unwrap()
        .trim_end_matches(".rs")
        .to_string();
    Source {
        path: path.to_string(),
        module,
        text: text.to_string(),
    }
}

const TABLE: &str = "//! | layer | modules |\n//! |---|---|\n//! | 0 core | `clock`, `rng` |\n\
                     //! | 1 domains | `health` |\n//! | 2 assembly | `pod` |\n";

#[test]
fn an_upward_import_is_named_with_its_file() {
    let layers = layer_table(TABLE).unwrap();
    let sources = [
        source("src/clock.rs", "use crate::pod::Pod;\n"),
        source("src/health/mod.rs", "use crate::clock::SimClock;\n"),
        source("src/pod/mod.rs", "use crate::{clock::SimClock, health};\n"),
        source("src/rng.rs", ""),
    ];
    let problems = violations(&sources, &layers, &BTreeMap::new());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("src/clock.rs: `crate::pod::Pod` points up the table"),
        "{problems:?}"
    );
}

#[test]
fn neighbours_and_unlisted_modules_are_refused_but_unit_tests_are_not() {
    let layers = layer_table(TABLE).unwrap();
    let sources = [
        source("src/clock.rs", "fn f() { crate::rng::draw(); }\n"),
        source("src/rng.rs", "#[cfg(test)]\nmod tests;\n"),
        source("src/rng/tests.rs", "use crate::pod::Pod;\n"),
        source(
            "src/health/mod.rs",
            "#[cfg(test)]\nmod t { use crate::pod::Pod; }\n",
        ),
        source("src/pod/mod.rs", ""),
        source("src/svg.rs", ""),
    ];
    let problems = violations(&sources, &layers, &BTreeMap::new());
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`svg` is not in the layer table"))
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("src/clock.rs: `crate::rng::draw` stays within layer 0"))
    );
}

#[test]
fn a_module_listed_twice_is_an_error() {
    let table = "//! | 0 core | `clock` |\n//! | 1 more | `clock` |\n";
    assert!(layer_table(table).unwrap_err().contains("layers 0 and 1"));
}

/// The seed's public paths keep working after the modules moved: each is
/// named here, so a move that drops one fails to compile.
#[allow(unused_imports)]
mod seed_paths {
    use optirs_tpu::coordination::{CoordinationError, PodConfig, PodCoordinator};
    use optirs_tpu::error::OptimError;
    use optirs_tpu::exec::kernels::Tensor;
    use optirs_tpu::exec::runtime::{Arg, Element, NoCustomCalls, RunOutput, Runtime};
    use optirs_tpu::fault_tolerance::FaultToleranceManager;
    use optirs_tpu::optimizers::{Adagrad, Adam, AdamW, Momentum, Nesterov, RMSProp, SGD};
    use optirs_tpu::pod::SimClock;
    use optirs_tpu::pod_coordination::TPUPodCoordinator;
    use optirs_tpu::pod_coordination::synchronization::clocks::protocols::NtpSynchronizer;
    use optirs_tpu::tpu::hbm::rebuild_heaps;
    use optirs_tpu::tpu::state::{DeviceHeap, OptimizerCount, OptimizerSlot};
    use optirs_tpu::xla::backend::profiling_integration::ProfilingIntegration;
    use optirs_tpu::xla::{CompileError, DType, GraphBuilder, TensorType};
    use optirs_tpu::{Optimizer, TPUConfig, TPUOptimizer, TPUVersion};

    #[test]
    fn seed_paths_name_the_moved_items() {
        // The seed path and the new home are the same item.
        let _: fn() -> optirs_tpu::ir::DType = || DType::F32;
        assert_eq!(
            std::any::type_name::<SimClock>(),
            std::any::type_name::<optirs_tpu::clock::SimClock>()
        );
        assert_eq!(
            std::any::type_name::<ProfilingIntegration>(),
            std::any::type_name::<optirs_tpu::profile::profiling_integration::ProfilingIntegration>(
            )
        );
        assert_eq!(
            std::any::type_name::<NtpSynchronizer>(),
            std::any::type_name::<optirs_tpu::clock_sync::NtpSynchronizer>()
        );
        assert_eq!(
            std::any::type_name::<OptimizerSlot>(),
            std::any::type_name::<optirs_tpu::memory::OptimizerSlot>()
        );
    }
}

/// The README's capability table (`| layer | module | what | status |`):
/// each row's layer and the modules it names in backticks.
fn readme_rows(readme: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let start = readme
        .find("| layer | module | what | status |")
        .ok_or("README.md has no `| layer | module | what | status |` table")?;
    let mut rows = Vec::new();
    for line in readme[start..].lines().skip(2) {
        let Some(row) = line.strip_prefix("| ") else {
            break;
        };
        let cells: Vec<&str> = row.split(" | ").collect();
        let layer = cells[0]
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("README row `{line}` has no layer number"))?;
        let modules = cells
            .get(1)
            .ok_or_else(|| format!("README row `{line}` has no modules"))?
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .map(str::to_string)
            .collect();
        rows.push((layer, modules));
    }
    Ok(rows)
}

/// What is wrong with the README's table against the crate docs' layers:
/// a module in the wrong layer, a row out of bottom-up order, a module
/// missing or unknown.
fn readme_problems(rows: &[(usize, Vec<String>)], layers: &BTreeMap<String, usize>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    let mut previous = 0;
    for (layer, modules) in rows {
        if *layer < previous {
            problems.push(format!(
                "README row of {modules:?} (layer {layer}) comes after layer {previous}"
            ));
        }
        previous = previous.max(*layer);
        for module in modules {
            match layers.get(module) {
                Some(l) if l == layer => {}
                Some(l) => problems.push(format!(
                    "README lists `{module}` in layer {layer}; the crate docs in layer {l}"
                )),
                None => problems.push(format!(
                    "README lists `{module}`, which the crate docs' table does not"
                )),
            }
            listed.insert(module.clone());
        }
    }
    for module in layers.keys() {
        if !listed.contains(module) {
            problems.push(format!("README's table does not list `{module}`"));
        }
    }
    problems
}

#[test]
fn the_readme_lists_every_module_bottom_up_in_its_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let problems = readme_problems(&readme_rows(&readme).unwrap(), &layer_table(&lib).unwrap());
    assert!(
        problems.is_empty(),
        "README.md's capability table disagrees with src/lib.rs:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn a_readme_row_out_of_order_or_missing_a_module_is_named() {
    let layers: BTreeMap<String, usize> =
        [("ir", 2), ("exec", 10), ("sharding", 11), ("goodput", 12)]
            .into_iter()
            .map(|(m, l)| (m.to_string(), l))
            .collect();
    let readme = "| layer | module | what | status |\n|---|---|---|---|\n\
        | 2 | `ir` | types | built |\n\
        | 11 | `sharding` | the step | built |\n\
        | 10 | `exec` (seed path `xla::exec`) | runtime | built |\n\
        \n## Next\n";
    let problems = readme_problems(&readme_rows(readme).unwrap(), &layers);
    assert_eq!(
        problems,
        [
            "README row of [\"exec\"] (layer 10) comes after layer 11",
            "README's table does not list `goodput`",
        ]
    );
}
