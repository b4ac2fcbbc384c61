//! Issue 13: no function in `src/` over 80 lines without a comment saying why. A long function
//! mixes steps a reader has to tell apart; where one is long on purpose (a grammar's match arms,
//! a table of test cases, one poll loop), the comment right above it says so, starting "Long on
//! purpose" or "Over 80 lines".

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 80;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `fn` items with a body: (name, first line index, length in lines). rustfmt'd code: a body
/// ends at the first `}` line at the item's own indentation; a signature ending in `;` (a trait
/// method declaration) has no body.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let Some(after) = [
            "pub fn ",
            "pub(crate) fn ",
            "fn ",
            "pub const fn ",
            "const fn ",
        ]
        .iter()
        .find_map(|p| trimmed.strip_prefix(p)) else {
            continue;
        };
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(sig_end) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';')
        }) else {
            continue;
        };
        if lines[sig_end].trim_end().ends_with(';') {
            continue;
        }
        let closing = format!("{indent}}}");
        if let Some(end) = (sig_end..lines.len()).find(|&j| lines[j].trim_end() == closing) {
            out.push((name, i, end - i + 1));
        }
    }
    out
}

/// The comment and attribute lines right above line `i`.
fn said_why(lines: &[&str], i: usize) -> bool {
    lines[..i]
        .iter()
        .rev()
        .take_while(|l| {
            let t = l.trim_start();
            t.starts_with("//") || t.starts_with("#[")
        })
        .any(|l| l.contains("Long on purpose") || l.contains("Over 80 lines"))
}

#[test]
fn no_function_in_src_is_over_80_lines_without_saying_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut offenders = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (name, i, len) in functions(&text) {
            if len > MAX_LINES && !said_why(&lines, i) {
                let rel = path.strip_prefix(root).unwrap().display();
                offenders.push(format!("{rel}:{} {name}: {len} lines", i + 1));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "split these into named steps, or say right above why one is long \
         (\"Long on purpose: ...\"):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_measure_counts_bodies_and_skips_declarations() {
    let text =
        "trait T {\n    fn a(&self)\n        -> u8;\n}\nfn b(\n    x: u8,\n) -> u8 {\n    x\n}\n";
    assert_eq!(functions(text), [("b".to_string(), 4, 5)]);
    let long = format!("fn c() {{\n{}}}\n", "    1;\n".repeat(MAX_LINES));
    let lines: Vec<&str> = long.lines().collect();
    assert_eq!(functions(&long), [("c".to_string(), 0, MAX_LINES + 2)]);
    assert!(!said_why(&lines, 0));
    let commented = format!("// Long on purpose: a table.\n#[test]\n{long}");
    let lines: Vec<&str> = commented.lines().collect();
    assert!(said_why(&lines, 2));
}
