//! What systemd-nspawn does with a `.nspawn` file's read-only binds, for the tests and benches
//! that boot a machine tree without nspawn: each `BindReadOnly=SOURCE[:TARGET]` whose target
//! `wanted` accepts, its source taken under the host tree `host`, bound at the target under the
//! machine tree `machine` (the mount point made like nspawn makes it) and remounted read-only.
//! Included by path (`#[path]`) from `tests/wiring_model.rs` and the hooks bench.

use anyhow::{Context as _, Result};
use nix::mount::{MsFlags, mount};
use std::path::{Path, PathBuf};

/// Make the read-only binds of `nspawn` (the file's text) that `wanted` accepts; returns the
/// mount points, outermost first (unmount them in reverse).
pub fn bind_read_only(
    nspawn: &str,
    host: &Path,
    machine: &Path,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<PathBuf>> {
    let mut mounted = Vec::new();
    for spec in nspawn
        .lines()
        .filter_map(|l| l.strip_prefix("BindReadOnly="))
    {
        let (source, target) = spec.split_once(':').unwrap_or((spec, spec));
        if !wanted(target) {
            continue;
        }
        let from = host.join(source.trim_start_matches('/'));
        let at = machine.join(target.trim_start_matches('/'));
        if !at.exists() {
            std::fs::create_dir_all(at.parent().unwrap_or(machine))?;
            if from.is_dir() {
                std::fs::create_dir(&at)?;
            } else {
                std::fs::write(&at, b"")?;
            }
        }
        mount(
            Some(&from),
            &at,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .with_context(|| format!("binding {} at {}", from.display(), at.display()))?;
        mount(
            None::<&str>,
            &at,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .with_context(|| format!("read-only {}", at.display()))?;
        mounted.push(at);
    }
    Ok(mounted)
}
