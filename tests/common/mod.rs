//! Helpers shared by the binary-level tests (`mod common;` in each test file that needs them).

#![allow(dead_code, clippy::unwrap_used)] // each test crate uses a subset; a panic is the report

use std::path::Path;

/// Copy a fixture directory tree (regular files and directories) into `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}
