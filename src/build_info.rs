//! What the binary was built from (`build.rs`): `--version` prints it.

/// `<version>\ncommit <commit>[, uncommitted changes]\nprofile <profile>, target <target>`.
pub(crate) const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit ",
    env!("NSPAWN_LIFECYCLE_COMMIT"),
    "\nprofile ",
    env!("NSPAWN_LIFECYCLE_PROFILE"),
    ", target ",
    env!("NSPAWN_LIFECYCLE_TARGET")
);

/// The package version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit built from (12 hex digits, `unknown` outside a checkout), without the note on
/// uncommitted changes.
pub fn commit() -> &'static str {
    let c = env!("NSPAWN_LIFECYCLE_COMMIT");
    c.split_once(',').map_or(c, |(hash, _)| hash)
}

/// Whether the tree it was built from had uncommitted changes to tracked files.
pub(crate) fn dirty() -> bool {
    env!("NSPAWN_LIFECYCLE_COMMIT").contains(", uncommitted changes")
}

/// This binary, as `status --json` names the helper that judged (`judgedBy`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Build {
    pub version: &'static str,
    pub commit: &'static str,
    pub dirty: bool,
}

/// This binary's [`Build`].
pub fn this() -> Build {
    Build {
        version: VERSION,
        commit: commit(),
        dirty: dirty(),
    }
}
