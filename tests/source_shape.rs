//! No function in `src/` over 80 lines without a comment saying why. A long function
//! mixes steps a reader has to tell apart; where one is long on purpose (a grammar's match arms,
//! a table of test cases, one poll loop), the comment right above it says so, starting "Long on
//! purpose" or "Over 80 lines".
//!
//! The CDI hooks' code (a process on what a pod controls) makes no temporary file or directory:
//! those follow `TMPDIR`, which is the pod's.
//!
//! The layout shows the architecture: each top-level module imports only the modules `src/lib.rs`
//! declares before it (types first, the commands last), no two modules import each other in a
//! circle, and no source file but a test module is over 800 lines.
//!
//! And the host side goes through its descriptor (`HostRoot`, src/fs/host.rs): no product code in
//! `src/` hands a joined host path (`host.path(…)`) to `std::fs`/`fs_err` or to a `Path` method
//! that touches the filesystem.
//!
//! The library's surface is what its users need (the binaries, `tests/`, `examples/`): a module
//! none of them names is `pub(crate)`, and the `pub` items reachable from outside the crate are
//! counted; a change that exports more must raise [`MAX_PUBLIC_ITEMS`], a decision its commit
//! says.

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
/// Every `.rs` file under `src/` but the unit-test modules of their own (`tests.rs`), sorted:
/// (path relative to the crate, text).
fn src_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.retain(|p| !p.ends_with("tests.rs"));
    files.sort();
    files
        .iter()
        .map(|path| {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            (rel, std::fs::read_to_string(path).unwrap())
        })
        .collect()
}

#[test]
fn no_function_in_src_is_over_80_lines_without_saying_why() {
    let mut offenders = Vec::new();
    for (rel, text) in src_files() {
        let lines: Vec<&str> = text.lines().collect();
        for (name, i, len) in functions(&text) {
            if len > MAX_LINES && !said_why(&lines, i) {
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

/// Files whose host accesses still go by joined path, and why. Keep it short.
const PATH_ALLOWED: &[(&str, &str)] = &[];

/// `Path` methods that go to the filesystem.
const FS_METHODS: &[&str] = &[
    "exists(",
    "is_dir(",
    "is_file(",
    "is_symlink(",
    "metadata(",
    "symlink_metadata(",
    "read_dir(",
    "read_link(",
    "canonicalize(",
    "try_exists(",
];

/// The text from `open` (just after a `(`) to its matching `)`, exclusive.
fn call_args(text: &str, open: usize) -> &str {
    let mut depth = 1;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open..open + i];
                }
            }
            _ => {}
        }
    }
    &text[open..]
}

/// Whether `s` holds `.path(` with an argument: a joined host path (`host.path("/etc")`), not a
/// path accessor such as `dir.path()`.
fn has_joined_path(s: &str) -> bool {
    s.match_indices(".path(")
        .any(|(i, m)| !call_args(s, i + m.len()).trim().is_empty())
}

/// The product code of a source file: everything before its `#[cfg(test)] mod`.
fn product(text: &str) -> &str {
    text.find("\n#[cfg(test)]\nmod ")
        .map_or(text, |i| &text[..i])
}

/// The places in `text` where a joined host path reaches the filesystem by string.
fn path_uses(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for prefix in ["fs::", "fs_err::"] {
        for (i, _) in text.match_indices(prefix) {
            let before = text[..i].chars().next_back();
            // `crate::fs::` is this crate's module of root handles, not std's.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                || text[..i].ends_with("crate::")
            {
                continue;
            }
            let rest = &text[i..];
            let Some(open) = rest.find('(') else { continue };
            let callee = &rest[..open];
            if !callee
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                continue;
            }
            if has_joined_path(call_args(rest, open + 1)) {
                found.push(format!("{callee}({}", call_args(rest, open + 1)));
            }
        }
    }
    for (i, m) in text.match_indices(".path(") {
        let args = call_args(text, i + m.len());
        if args.trim().is_empty() {
            continue;
        }
        let after = text[i + m.len() + args.len() + 1..].trim_start();
        if let Some(method) = after
            .strip_prefix('.')
            .and_then(|a| FS_METHODS.iter().find(|f| a.starts_with(**f)))
        {
            found.push(format!(".path({args}).{method}"));
        }
    }
    found
}

#[test]
fn host_files_are_reached_through_the_host_descriptor() {
    let mut offenders = Vec::new();
    for (rel, text) in src_files() {
        if PATH_ALLOWED.iter().any(|(f, _)| *f == rel) {
            continue;
        }
        for u in path_uses(product(&text)) {
            offenders.push(format!("{rel}: {u}"));
        }
    }
    assert!(
        offenders.is_empty(),
        "open host files through the HostRoot (host.read(..), host.metadata(..), ...), not by \
         joined path:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_path_check_tells_joined_paths_from_accessors() {
    let bad = "let t = std::fs::read_to_string(\n    ctx.host.path(&dropin),\n)?;\n\
               if host.path(\"/lib/modules\").is_dir() {}\n\
               fs_err::write(host.path(x), b)?;\n";
    assert_eq!(path_uses(bad).len(), 3, "{:?}", path_uses(bad));
    let good = "std::fs::read(dir.path().join(\"x\"))?;\nlet p = host.path(\"/etc\");\n\
                format!(\"{}\", host.path(x).display());\nmyfs::read(host.path(x));\n";
    assert_eq!(path_uses(good), Vec::<String>::new());
    assert_eq!(
        product("fn a() {}\n#[cfg(test)]\nmod tests {}\n"),
        "fn a() {}"
    );
}

/// The modules a `cdi-hook` runs: nothing there may reach for a temporary directory.
#[test]
fn the_hooks_make_no_temporary_files() {
    for file in [
        "apply/cdi_hook.rs",
        "fs/fd_mount.rs",
        "discovery/ldcache.rs",
        "fs/machine_root.rs",
        "fs/atomic.rs",
    ] {
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(file))
                .unwrap();
        for needle in [
            "tempfile::",
            "temp_dir",
            "TMPDIR",
            "env::var(",
            "env::var_os(",
        ] {
            assert!(
                !product(&text).contains(needle),
                "src/{file} uses {needle} outside its tests: a hook must take nothing from its environment"
            );
        }
    }
}

/// The top-level modules, in the order `src/lib.rs` declares them: the layers of the crate.
fn layers() -> Vec<String> {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// The module a source file is (`src/model/links.rs` → `model::links`, `src/model/mod.rs` →
/// `model`); `None` for the crate root and the binaries (`src/main.rs`, `src/bin/`), which use
/// the library as its other users do.
fn module_of(rel: &str) -> Option<Vec<String>> {
    let path = rel.strip_prefix("src/")?.strip_suffix(".rs")?;
    if path.starts_with("bin/") {
        return None;
    }
    let mut parts: Vec<String> = path.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    (!parts.is_empty() && parts != ["lib"] && parts != ["main"]).then_some(parts)
}

/// The modules of this crate a file's product code names (`crate::a::b::…` as `[a, b]`; `Ctx`,
/// re-exported at the root, is `ctx`), comments and its test module left out.
fn crate_refs(text: &str) -> Vec<Vec<String>> {
    let code: String = product(text)
        .lines()
        .map(|l| match l.trim_start().starts_with("//") {
            true => "",
            false => l.split(" //").next().unwrap_or(l),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let path: Vec<String> = code[i + "crate::".len()..]
            .split("::")
            .map(|seg| {
                seg.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|seg| seg.starts_with(|c: char| c.is_ascii_lowercase() || c == 'C'))
            .take(2)
            .collect();
        match path.first().map(String::as_str) {
            Some("Ctx") => out.push(vec!["ctx".to_owned()]),
            Some(_) => out.push(path),
            None => {}
        }
    }
    out
}

#[test]
fn each_module_imports_only_the_layers_below_it() {
    let layers = layers();
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut offenders = Vec::new();
    for (rel, text) in src_files() {
        let Some(me) = module_of(&rel) else { continue };
        let mine = rank(&me[0]).unwrap_or_else(|| panic!("{rel}: {} is not in src/lib.rs", me[0]));
        for r in crate_refs(&text) {
            match rank(&r[0]) {
                Some(theirs) if theirs > mine => {
                    offenders.push(format!("{rel} ({}) imports {}", me[0], r.join("::")));
                }
                _ => {}
            }
        }
    }
    offenders.sort();
    offenders.dedup();
    assert!(
        offenders.is_empty(),
        "a module imports a layer above it (src/lib.rs declares the layers bottom up):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn no_two_modules_import_each_other_in_a_circle() {
    use std::collections::{BTreeMap, BTreeSet};
    // Modules two levels deep (`model::links`), edges between different ones.
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in src_files() {
        let Some(me) = module_of(&rel) else { continue };
        let me = me[..me.len().min(2)].join("::");
        for r in crate_refs(&text) {
            let to = r.join("::");
            if to != me
                && !me.starts_with(&format!("{to}::"))
                && !to.starts_with(&format!("{me}::"))
            {
                edges.entry(me.clone()).or_default().insert(to);
            }
        }
    }
    // A circle: a module that reaches itself.
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    circles.push(format!("{} -> {start}", path.join(" -> ")));
                } else if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_source_file_is_over_800_lines_but_test_modules() {
    let offenders: Vec<String> = src_files()
        .into_iter()
        .filter_map(|(rel, text)| {
            let n = text.lines().count();
            (n > 800).then(|| format!("{rel}: {n} lines"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "split these by concern (a test module may live in a tests.rs of its own):\n{}",
        offenders.join("\n")
    );
}

/// The check itself: it sees a layer violation and a circle in made-up sources.
#[test]
fn the_layer_checks_see_what_they_look_for() {
    assert_eq!(module_of("src/model/links.rs").unwrap(), ["model", "links"]);
    assert_eq!(module_of("src/model/mod.rs").unwrap(), ["model"]);
    assert_eq!(module_of("src/lib.rs"), None);
    let refs = crate_refs(
        "use crate::model::links::DirSeen;\n// crate::apply::gate in a comment\nfn f(c: &crate::Ctx) {}\n\
         #[cfg(test)]\nmod tests { use crate::commands::x; }",
    );
    assert_eq!(
        refs,
        [
            vec!["model".to_owned(), "links".to_owned()],
            vec!["ctx".to_owned()]
        ]
    );
}

/// The most `pub` items the library may export (items in files whose every `mod` declaration,
/// from `src/lib.rs` down, is `pub`); lower it when the surface narrows.
const MAX_PUBLIC_ITEMS: usize = 403;

/// The `pub` items of the files reachable from outside the crate, and those files.
fn public_surface() -> (usize, Vec<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut items = 0;
    let mut files = Vec::new();
    let mut todo = vec![(src.join("lib.rs"), src.clone())];
    while let Some((file, dir)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = product(&text);
        files.push(file.strip_prefix(&src).unwrap().display().to_string());
        for line in code.lines() {
            let l = line.trim_start();
            if let Some(rest) = l.strip_prefix("pub ") {
                let kind = rest.split_whitespace().next().unwrap_or("");
                if matches!(
                    kind,
                    "fn" | "struct" | "enum" | "trait" | "const" | "static" | "type" | "use"
                ) {
                    items += 1;
                }
                if let Some(name) = rest.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                    let f = [
                        dir.join(format!("{name}.rs")),
                        dir.join(name).join("mod.rs"),
                    ]
                    .into_iter()
                    .find(|f| f.is_file())
                    .unwrap();
                    todo.push((f, dir.join(name)));
                }
            }
        }
    }
    (items, files)
}

#[test]
fn the_library_exports_no_more_than_its_users_need() {
    let (items, files) = public_surface();
    assert!(
        files.iter().any(|f| f == "apply/parts/mod.rs") && !files.iter().any(|f| f == "fs/lock.rs"),
        "the walk follows pub mod only: {files:?}"
    );
    assert!(
        items <= MAX_PUBLIC_ITEMS,
        "the library exports {items} pub items (in {} files), more than MAX_PUBLIC_ITEMS = \
         {MAX_PUBLIC_ITEMS}: make what the binaries, tests/ and examples/ do not name pub(crate), \
         or raise the bound and say why",
        files.len()
    );
}
