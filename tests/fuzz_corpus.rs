//! Replays every committed fuzz input through the entry point its cargo-fuzz target calls, on
//! stable and without libFuzzer, so CI keeps exercising what the fuzzers found interesting:
//! `tests/fuzz/seeds/<target>/` (real inputs written by hand or by ldconfig) and
//! `tests/fuzz/corpus/<target>/` (what the fuzzers kept, minimized). A panic names the file.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

// The entry points the cargo-fuzz targets call: the fuzz crate's library, compiled in here.
#[path = "fuzz/src/lib.rs"]
mod fuzzing;
use fuzzing::TARGETS;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz")
}

/// Names of the entries of `dir`, sorted; `strip` removes a suffix and skips names without it.
fn names(dir: &Path, strip: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|n| n.strip_suffix(strip).map(str::to_owned))
        .collect()
}

#[test]
fn every_fuzz_target_has_an_entry_point_and_a_corpus() {
    let entry_points: BTreeSet<String> = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
    assert_eq!(entry_points.len(), TARGETS.len(), "duplicate target name");
    assert_eq!(
        names(&fuzz_dir().join("fuzz_targets"), ".rs"),
        entry_points,
        "tests/fuzz/fuzz_targets/*.rs and tests/fuzz/src/lib.rs TARGETS disagree"
    );
    for dir in ["corpus", "seeds"] {
        assert_eq!(
            names(&fuzz_dir().join(dir), ""),
            entry_points,
            "tests/fuzz/{dir}/ must hold one directory per target, and nothing else"
        );
    }
}

#[test]
fn every_corpus_file_replays_without_a_panic() {
    let mut total = 0;
    for (name, entry) in TARGETS {
        for kind in ["seeds", "corpus"] {
            let dir = fuzz_dir().join(kind).join(name);
            let files = names(&dir, "");
            assert!(
                !files.is_empty(),
                "{}: empty; run the target and tests/fuzz/cmin.sh (tests/fuzz/README.md)",
                dir.display()
            );
            for file in &files {
                let path = dir.join(file);
                // A fuzzer running beside the suite (tests/fuzz/run.sh) prunes its corpus as it
                // goes: a file listed a moment ago may be gone.
                let data = match std::fs::read(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    r => r.unwrap(),
                };
                if std::panic::catch_unwind(|| entry(&data)).is_err() {
                    panic!("fuzz target {name} panicked on {}", path.display());
                }
            }
            total += files.len();
        }
    }
    eprintln!(
        "replayed {total} seed and corpus files through {} targets",
        TARGETS.len()
    );
}
