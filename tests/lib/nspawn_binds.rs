//! What systemd-nspawn does with a `.nspawn` file's read-only binds, for the tests and benches
//! that boot a machine tree without nspawn: each `BindReadOnly=SOURCE[:TARGET]` whose target
//! `wanted` accepts, its source taken under the host tree `host`, bound at the target under the
//! machine tree `machine` (the mount point made like nspawn makes it) and remounted read-only.
//! Included by path (`#[path]`) from `tests/wiring_model.rs` and the hooks bench. And its device
//! binds ([`device_binds`]).

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
        bind(&from, &at)?;
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

/// Make the device binds of `nspawn` (each `Bind=/dev/…` at the same path) in `machine` as
/// systemd-nspawn does: a directory of the host tree `host` bound (nodes the host makes later
/// appear in it), a node made with the host node's type and numbers. Returns the mount points
/// (unmount them in reverse).
pub fn device_binds(nspawn: &str, host: &Path, machine: &Path) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt as _;
    let mut mounted = Vec::new();
    let nodes = nspawn.lines().filter_map(|l| {
        l.strip_prefix("Bind=/dev/")
            .or_else(|| l.strip_prefix("BindReadOnly=/dev/"))
    });
    for node in nodes {
        let (from, at) = (host.join("dev").join(node), machine.join("dev").join(node));
        std::fs::create_dir_all(at.parent().unwrap_or(machine))?;
        let meta = std::fs::symlink_metadata(&from)
            .with_context(|| format!("the bound {}", from.display()))?;
        if meta.is_dir() {
            std::fs::create_dir(&at)?;
            bind(&from, &at)?;
            mounted.push(at);
        } else {
            let kind = nix::sys::stat::SFlag::from_bits_truncate(
                meta.mode() & nix::sys::stat::SFlag::S_IFMT.bits(),
            );
            nix::sys::stat::mknod(
                &at,
                kind,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                meta.rdev(),
            )
            .with_context(|| format!("mknod {}", at.display()))?;
        }
    }
    Ok(mounted)
}

/// Bind `from` at `at`.
fn bind(from: &Path, at: &Path) -> Result<()> {
    mount(Some(from), at, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("binding {} at {}", from.display(), at.display()))
}
