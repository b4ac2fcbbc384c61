//! What the binary was built from (`build.rs`): `--version` prints it.

/// `<version>\ncommit <commit>[, uncommitted changes]\nprofile <profile>, target <target>`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit ",
    env!("NSPAWN_LIFECYCLE_COMMIT"),
    "\nprofile ",
    env!("NSPAWN_LIFECYCLE_PROFILE"),
    ", target ",
    env!("NSPAWN_LIFECYCLE_TARGET")
);
