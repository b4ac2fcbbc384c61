//! post-start's own run against a machine rootfs on disk with no systemd in it, its services
//! replaced: for the crash tests (`rewire-root`, failpoints builds) and the wiring model's
//! property test (the test kit). Everything but the services and how the machine is reached
//! is the command's ([`Prepared`], [`TargetRun`]).

use super::{Prepared, TargetRun};
use crate::Ctx;
#[cfg(feature = "failpoints")]
use crate::apply::gate;
#[cfg(feature = "failpoints")]
use crate::discovery;
#[cfg(feature = "failpoints")]
use crate::fs::host::HostRoot;
use crate::fs::machine_root::MachineRoot;
#[cfg(feature = "failpoints")]
use crate::systemd::services::OnDisk;
use crate::systemd::services::Services;
use crate::types::machine_name::{MachineName, Subject};
#[cfg(feature = "failpoints")]
use anyhow::Context as _;
use anyhow::Result;
use std::time::Instant;

/// post-start of `machine` against a machine rootfs on disk, with `services` in place of its
/// systemd: the command's lock, discovery, [`crate::model::Desired`], parts and executor
/// ([`TargetRun::finish`]), as a run by hand (the gated order).
pub fn run_on_disk(
    ctx: &Ctx,
    machine: &MachineName,
    root: &MachineRoot,
    services: &dyn Services,
) -> Result<()> {
    let p = Prepared::open(ctx, machine, "post-start")?;
    on_disk(&ctx.host, machine, &p, root, services)
}

/// [`run_on_disk`] once prepared, with the host at `host`.
fn on_disk(
    host: &crate::fs::host::HostRoot,
    machine: &MachineName,
    p: &Prepared,
    root: &MachineRoot,
    services: &dyn Services,
) -> Result<()> {
    let run = TargetRun {
        who: Subject::Machine(machine),
        in_its_start: false,
        mc: &p.mc,
        host,
        root,
        desired: &p.desired,
    };
    run.finish(Instant::now(), || Ok(services), || Ok(services))
}

/// `rewire-root` (failpoints builds only): post-start's own run ([`run_on_disk`]'s) against a
/// machine rootfs directory on disk with no systemd in it ([`OnDisk`]), its driver root bound
/// as nspawn binds it, for the crash tests.
#[cfg(feature = "failpoints")]
pub fn rewire_root(ctx: &Ctx, machine: &MachineName, dir: &std::path::Path) -> Result<()> {
    let p = Prepared::open(ctx, machine, "post-start")?;
    // The machine's share, complete: for_hooks refuses it otherwise.
    let driver = p
        .desired
        .start
        .as_ref()
        .and_then(|s| s.assignment.view.complete_driver());
    // Before the machine root and the host root are opened (again): a descriptor opened in the
    // old mount namespace would not see the mounts made in the new one, and a bind from it is
    // refused (EINVAL: its source is not in this namespace).
    private_mount_namespace()?;
    let host = HostRoot::open(ctx.host.root())?;
    let root = MachineRoot::open(dir)?;
    root.refuse_host_root(std::path::Path::new("/"))?;
    if let Some(driver) = driver {
        bind_driver_root(&root, &host, driver)?;
    }
    let services = OnDisk { dir };
    if driver.is_some() {
        // Each run is a boot: it begins with the machine's markers emptied, as pre-start leaves
        // them.
        gate::prepare_boot(&host, machine, None)?;
    }
    on_disk(&host, machine, &p, &root, &services)
}

/// A mount namespace of this process only, for `rewire-root`'s driver binds: gone when it exits,
/// as the machine's `/run` goes with the machine.
#[cfg(feature = "failpoints")]
fn private_mount_namespace() -> Result<()> {
    use nix::mount::{MsFlags, mount};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .context("rewire-root: unshare(CLONE_NEWNS)")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("rewire-root: making / private")
}

/// What systemd-nspawn does with the driver binds of the `.nspawn` file, for `rewire-root` (in
/// the namespace of [`private_mount_namespace`]): a tmpfs at the driver root with every bind of
/// [`crate::model::layout::driver_binds`] mounted read-only at its target.
#[cfg(feature = "failpoints")]
fn bind_driver_root(
    root: &MachineRoot,
    host: &HostRoot,
    driver: &discovery::UserspaceDriver,
) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let top = root.create_dir_all(crate::model::layout::DRIVER_ROOT, 0o755)?;
    // By descriptor: the directory was resolved inside the machine root once.
    let at = format!("/proc/self/fd/{}", top.as_fd().as_raw_fd());
    mount(
        Some("tmpfs"),
        at.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NODEV,
        Some("mode=0755"),
    )
    .with_context(|| format!("rewire-root: tmpfs on {}", top.path()))?;
    // The tmpfs just mounted, looked up again by path: the old descriptor (and a reopen of its
    // /proc magic link) still names the directory underneath. Ours alone, so plain paths below
    // it are safe.
    let tmp = root
        .open_dir(crate::model::layout::DRIVER_ROOT)?
        .context("rewire-root: the driver root tmpfs vanished")?;
    let base = format!("/proc/self/fd/{}", tmp.as_fd().as_raw_fd());
    // Every node of pre-start's host tree (files bound rather than hard-linked), then the
    // directory binds, then the tree read-only, as nspawn binds it.
    use crate::model::layout::TreeNode;
    for (rel, node) in crate::model::layout::driver_tree(driver)? {
        let at = format!("{base}/{rel}");
        let shown = format!("{}/{rel}", crate::model::layout::DRIVER_ROOT);
        match node {
            TreeNode::Dir => std::fs::create_dir_all(&at),
            TreeNode::Hard(source) | TreeNode::Bound(source) => {
                std::fs::File::create(&at)
                    .with_context(|| format!("rewire-root: mount point {shown}"))?;
                bind_read_only(host, &source, &at, &shown)?;
                Ok(())
            }
            TreeNode::Link(to) => std::os::unix::fs::symlink(&to, &at),
            TreeNode::File(bytes) => std::fs::write(&at, bytes),
        }
        .with_context(|| format!("rewire-root: {shown}"))?;
    }
    for b in crate::model::layout::dir_binds(driver)? {
        let rel = b
            .target
            .strip_prefix(crate::model::layout::DRIVER_ROOT)
            .unwrap_or(b.target.as_str());
        let target = format!("{base}{rel}");
        bind_read_only(host, b.source.as_str(), &target, &b.target)?;
    }
    mount(
        None::<&str>,
        base.as_str(),
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| {
        format!(
            "rewire-root: read-only {}",
            crate::model::layout::DRIVER_ROOT
        )
    })?;
    Ok(())
}

/// Bind the host file `source` (resolved inside the host root, bound through its descriptor)
/// read-only at `target`; `shown` names the target in messages.
#[cfg(feature = "failpoints")]
fn bind_read_only(host: &HostRoot, source: &str, target: &str, shown: &str) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    use std::os::fd::AsRawFd as _;
    let display = host.path(source);
    let pinned = host
        .pin(source)
        .with_context(|| format!("rewire-root: opening {}", display.display()))?;
    mount(
        Some(format!("/proc/self/fd/{}", pinned.as_raw_fd()).as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("rewire-root: binding {} at {shown}", display.display()))?;
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| format!("rewire-root: read-only {shown}"))
}
