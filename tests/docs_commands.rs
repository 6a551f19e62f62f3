//! Docs that cannot drift: every command shown in a shell block of the
//! README and `docs/*.md` runs here against the built binary, and the
//! output the text quotes is checked against what it prints.
//!
//! How the blocks are read (```` ```sh ````, ```` ```bash ```` and bare
//! ```` ``` ```` fences):
//! - `cargo run --release -- ARGS`, `optirs-tpu ARGS` and
//!   `target/release/optirs-tpu ARGS` run the binary with ARGS (a trailing
//!   `> FILE` writes stdout to FILE), exit 0 expected;
//! - `echo '...' > FILE` writes the file;
//! - a line `#   TEXT` right under a command quotes its output: every
//!   `...`-separated piece of TEXT (whitespace normalized) must appear in
//!   what the command printed;
//! - a loop (`for ... done`) runs as one `bash` script with the binary on
//!   `PATH`, when the tools it pipes to are installed;
//! - builds, tests, benchmarks, examples, Python peers and MPI launches are
//!   not the binary's commands: each is listed as skipped, with why.
//!
//! Each file's blocks run in order in one temporary directory holding a
//! link to `assets/`, so a command's outputs land there and later blocks
//! of the same file can read them. A command too slow for a debug build is
//! marked in the doc source just above its block:
//! `<!-- slow: "TEXT" => "SMALLER" (why) -->` runs it with TEXT replaced by
//! SMALLER; `<!-- slow: "TEXT" (why) -->` skips the commands containing TEXT;
//! `"=TEXT"` matches only the command TEXT itself (its arguments after the
//! binary's name), and its replacement is the whole command.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_optirs-tpu");

/// A command of a block, with where it is and what its output must show.
#[derive(Debug)]
struct Shown {
    file: String,
    line: usize,
    text: String,
    quoted: Vec<String>,
}

/// A `<!-- slow: ... -->` mark: text, its replacement (none: skip), why.
#[derive(Debug, Clone)]
struct Slow {
    text: String,
    instead: Option<String>,
    why: String,
}

impl Slow {
    /// `"=TEXT"` matches the command TEXT exactly; `"TEXT"` any command
    /// containing it.
    fn matches(&self, command: &str) -> bool {
        match self.text.strip_prefix('=') {
            Some(exact) => command == exact,
            None => command.contains(&self.text),
        }
    }
}

fn parse_slow(line: &str) -> Option<Slow> {
    let body = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim();
    let body = body.strip_prefix("slow:")?.trim();
    let quoted = |s: &str| -> Option<(String, String)> {
        let s = s.trim_start().strip_prefix('"')?;
        let end = s.find('"')?;
        Some((s[..end].to_string(), s[end + 1..].to_string()))
    };
    let (text, rest) = quoted(body)?;
    let (instead, rest) = match rest.trim_start().strip_prefix("=>") {
        Some(rest) => {
            let (instead, rest) = quoted(rest)?;
            (Some(instead), rest)
        }
        None => (None, rest),
    };
    let why = rest
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .to_string();
    Some(Slow { text, instead, why })
}

/// One fenced shell block: its commands (continuation lines joined), the
/// slow marks above it, and the line it starts on.
struct Block {
    file: String,
    start: usize,
    lines: Vec<(usize, String)>,
    slow: Vec<Slow>,
}

fn blocks(file: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i + 1;
        let end = (start..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or(lines.len());
        if matches!(lang.trim(), "sh" | "bash" | "") {
            let slow = (i.saturating_sub(8)..i)
                .filter_map(|j| parse_slow(lines[j]))
                .collect();
            let mut joined: Vec<(usize, String)> = Vec::new();
            let mut pending: Option<(usize, String)> = None;
            for (j, line) in lines.iter().enumerate().take(end).skip(start) {
                let (at, mut text) = pending.take().unwrap_or((j + 1, String::new()));
                match line.strip_suffix('\\') {
                    Some(head) => {
                        text += head;
                        pending = Some((at, text));
                    }
                    None => {
                        text += line;
                        joined.push((at, text));
                    }
                }
            }
            out.push(Block {
                file: file.to_string(),
                start,
                lines: joined,
                slow,
            });
        }
        i = end + 1;
    }
    out
}

/// Shell words of `line` up to an unquoted `#` (single and double quotes,
/// no expansion).
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') if !in_word => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

fn normalized(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the docs test does with one command line.
enum Step {
    /// Run the binary with these arguments, stdout to a file if given.
    Run(Vec<String>, Option<String>),
    /// Write a file.
    Write(String, String),
    /// Not the binary's command: why.
    Skip(&'static str),
}

fn step_of(line: &str) -> Option<Step> {
    let mut w = words(line);
    if w.is_empty() {
        return None;
    }
    // `cargo build --release && target/release/optirs-tpu ...`
    let built_first = |at: usize, w: &[String]| {
        w[..at]
            .iter()
            .all(|x| x == "cargo" || x == "build" || x == "--release")
    };
    if let Some(at) = w.iter().position(|x| x == "&&")
        && built_first(at, &w)
    {
        w.drain(..=at);
    }
    let skip = |why| Some(Step::Skip(why));
    let redirect = |w: &mut Vec<String>| match w.iter().position(|x| x == ">") {
        Some(at) => {
            let file = w.get(at + 1).cloned();
            w.truncate(at);
            file
        }
        None => None,
    };
    match w[0].as_str() {
        "echo" => {
            let to = redirect(&mut w)?;
            Some(Step::Write(to, w[1..].join(" ") + "\n"))
        }
        "optirs-tpu" | "target/release/optirs-tpu" => {
            let to = redirect(&mut w);
            Some(Step::Run(w[1..].to_vec(), to))
        }
        "cargo" if w.get(1).map(String::as_str) == Some("run") => {
            if w.iter().any(|x| x == "--example") {
                return skip(
                    "an example program, not the binary (`cargo test` builds every example)",
                );
            }
            let at = w.iter().position(|x| x == "--")?;
            let to = redirect(&mut w);
            Some(Step::Run(w[at + 1..].to_vec(), to))
        }
        "cargo" => skip("builds, tests or benchmarks the crate itself"),
        "mpirun" => skip("MPI: needs `--features mpi` and mpirun (tests/mpi.rs runs these pods)"),
        "sudo" => skip("installs system packages"),
        "python3" => skip("a benchmark against Python peers (numpy, JAX)"),
        _ => None,
    }
}

fn run(args: &[String], dir: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// The commands of one doc, run in order in one directory.
fn run_doc(path: &Path, report: &mut Vec<String>, ran: &mut usize, skipped: &mut usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = path.strip_prefix(root).unwrap().display().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root.join("assets"), dir.path().join("assets")).unwrap();
    for block in blocks(&file, &text) {
        let is_loop = block
            .lines
            .iter()
            .any(|(_, l)| l.trim_start().starts_with("for "));
        if is_loop {
            run_script(&block, dir.path(), report, ran, skipped);
            continue;
        }
        let mut shown: Vec<(Shown, Step)> = Vec::new();
        for (line, text) in &block.lines {
            if let Some(quote) = text.trim_start().strip_prefix("#   ") {
                if let Some((last, _)) = shown.last_mut() {
                    last.quoted.push(quote.to_string());
                }
                continue;
            }
            if let Some(step) = step_of(text) {
                let entry = Shown {
                    file: block.file.clone(),
                    line: *line,
                    text: text.clone(),
                    quoted: Vec::new(),
                };
                shown.push((entry, step));
            }
        }
        for (shown, step) in shown {
            let at = format!("{}:{}", shown.file, shown.line);
            match step {
                Step::Skip(why) => {
                    *skipped += 1;
                    report.push(format!("skipped {at}: {why}: {}", shown.text.trim()));
                }
                Step::Write(to, contents) => {
                    std::fs::write(dir.path().join(to), contents).unwrap();
                }
                Step::Run(mut args, to) => {
                    let command = args.join(" ");
                    let slow = block.slow.iter().find(|s| s.matches(&command));
                    if let Some(slow) = slow {
                        match &slow.instead {
                            None => {
                                *skipped += 1;
                                report
                                    .push(format!("skipped {at}: slow ({}): {command}", slow.why));
                                continue;
                            }
                            Some(instead) => {
                                let smaller = match slow.text.strip_prefix('=') {
                                    Some(_) => instead.clone(),
                                    None => command.replace(&slow.text, instead),
                                };
                                report.push(format!("smaller {at}: {smaller} ({})", slow.why));
                                args = words(&smaller);
                            }
                        }
                    }
                    let started = Instant::now();
                    let out = run(&args, dir.path());
                    *ran += 1;
                    let stdout = String::from_utf8_lossy(&out.stdout);
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    assert!(
                        out.status.success(),
                        "{at}: `{command}` exited {:?}: {stderr}",
                        out.status.code()
                    );
                    let line = format!(
                        "ran {at} in {:.1} s: {}",
                        started.elapsed().as_secs_f64(),
                        args.join(" ")
                    );
                    eprintln!("{line}");
                    report.push(line);
                    if let Some(to) = to {
                        std::fs::write(dir.path().join(to), out.stdout.as_slice()).unwrap();
                    }
                    let printed = normalized(&format!("{stdout}\n{stderr}"));
                    let quoted = normalized(&shown.quoted.join(" "));
                    for piece in quoted.split("...").map(str::trim).filter(|p| !p.is_empty()) {
                        assert!(
                            printed.contains(piece),
                            "{at}: the doc quotes `{piece}`, `{command}` printed:\n{stdout}"
                        );
                    }
                }
            }
        }
    }
}

/// A block with a loop: one `bash` script, the binary on `PATH` as
/// `optirs-tpu`, when every tool it pipes to is installed.
fn run_script(
    block: &Block,
    dir: &Path,
    report: &mut Vec<String>,
    ran: &mut usize,
    skipped: &mut usize,
) {
    let at = format!("{}:{}", block.file, block.start + 1);
    let script: String = block.lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let tools: Vec<&str> = script
        .split('|')
        .skip(1)
        .filter_map(|piece| piece.split_whitespace().next())
        .collect();
    let missing: Vec<&&str> = tools
        .iter()
        .filter(|tool| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    if !missing.is_empty() {
        *skipped += 1;
        report.push(format!(
            "skipped {at}: a loop piping to {missing:?}, not installed"
        ));
        return;
    }
    let bin_dir = dir.join(".bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let link = bin_dir.join("optirs-tpu");
    if !link.exists() {
        std::os::unix::fs::symlink(BIN, &link).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let started = Instant::now();
    let out = Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", &script])
        .current_dir(dir)
        .env("PATH", path)
        .output()
        .unwrap();
    *ran += 1;
    assert!(
        out.status.success(),
        "{at}: the block's script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    report.push(format!(
        "ran {at} in {:.1} s: a loop as one script",
        started.elapsed().as_secs_f64()
    ));
}

fn docs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_command_in_the_readme_and_docs_runs_and_prints_what_they_quote() {
    let started = Instant::now();
    let (mut report, mut ran, mut skipped) = (Vec::new(), 0, 0);
    for path in docs() {
        run_doc(&path, &mut report, &mut ran, &mut skipped);
    }
    for line in &report {
        println!("{line}");
    }
    println!(
        "docs commands: {ran} run, {skipped} skipped, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        ran >= 20,
        "only {ran} commands found: is the parser reading the blocks?"
    );
}

#[test]
fn the_block_reader_splits_words_marks_and_continuations() {
    assert_eq!(
        words("echo 'Pod(name: \"x\")' > pod.ron   # a comment"),
        ["echo", "Pod(name: \"x\")", ">", "pod.ron"]
    );
    assert_eq!(
        words("train --json | jq .x # y"),
        ["train", "--json", "|", "jq", ".x"]
    );
    let slow =
        parse_slow("<!-- slow: \"--days 54\" => \"--days 2\" (54 days take minutes) -->").unwrap();
    assert_eq!(
        (slow.text.as_str(), slow.instead.as_deref()),
        ("--days 54", Some("--days 2"))
    );
    assert_eq!(slow.why, "54 days take minutes");
    let text =
        "<!-- slow: \"v4-8192\" (minutes) -->\n```sh\noptirs-tpu a \\\n    b\n#   out\n```\n";
    let blocks = blocks("x.md", text);
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        blocks[0].lines,
        [
            (3, "optirs-tpu a     b".to_string()),
            (5, "#   out".to_string())
        ]
    );
    assert!(blocks[0].slow[0].instead.is_none());
}
