//! post-start against a machine rootfs on disk with no systemd in it: for the crash tests
//! (`rewire-root`, failpoints builds) and the wiring model's property test (the test kit).

use super::clean;
use crate::Ctx;
use crate::apply::executor::{Order, Wiring, execute, plan};
use crate::apply::gate;
use crate::config::MachineConfig;
use crate::discovery;
use crate::fs::host::HostRoot;
use crate::fs::lock;
use crate::fs::machine_root::MachineRoot;
use crate::model::{Desired, Target};
#[cfg(feature = "failpoints")]
use crate::systemd::services::OnDisk;
use crate::systemd::services::Services;
use crate::types::machine_name::MachineName;
#[cfg(feature = "failpoints")]
use anyhow::Context as _;
use anyhow::Result;

/// post-start of `machine` against a machine rootfs on disk, with `services` in place of its
/// systemd: the product's lock, discovery, [`Desired`], no-GPU cleanup and, with GPUs, [`plan`]
/// (the gated order) run by [`execute`] over [`Wiring`]. For the crash tests (`rewire-root`) and
/// the wiring model's property test.
#[cfg(any(feature = "failpoints", feature = "testkit"))]
pub fn run_on_disk(
    ctx: &Ctx,
    machine: &MachineName,
    root: &MachineRoot,
    services: &dyn Services,
) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let desired = Desired::for_hooks(ctx, machine, &mc, &discovery::discover(&ctx.host)?)?;
    on_disk(machine, &mc, &ctx.host, &desired, root, services)
}

/// [`run_on_disk`] once locked and discovered.
#[cfg(any(feature = "failpoints", feature = "testkit"))]
fn on_disk(
    machine: &MachineName,
    mc: &MachineConfig,
    host: &HostRoot,
    desired: &Desired,
    root: &MachineRoot,
    services: &dyn Services,
) -> Result<()> {
    let who = machine.as_str();
    let markers = gate::Markers::of_machine(host, who);
    if desired.driver.is_none() {
        clean(who, Target::Machine, mc, root, &markers)?;
        return Ok(());
    }
    let wiring = Wiring {
        machine: who,
        mc,
        host,
        markers: &markers,
        root,
        desired,
        services,
    };
    execute(
        &plan(mc, Target::Machine, Order::Gated),
        who,
        &wiring,
        services,
    )
}

/// `rewire-root` (failpoints builds only): post-start's plan and executor, exactly as the product
/// runs them ([`plan`], [`execute`] over [`Wiring`]), against a
/// machine rootfs directory on disk with no systemd in it ([`OnDisk`]), for the crash tests.
#[cfg(feature = "failpoints")]
pub fn rewire_root(ctx: &Ctx, machine: &MachineName, dir: &std::path::Path) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let desired = Desired::for_hooks(ctx, machine, &mc, &discovery::discover(&ctx.host)?)?;
    // The machine's share, complete: for_hooks refuses it otherwise.
    let driver = desired
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
        gate::prepare_boot(&host, machine.as_str(), None)?;
    }
    on_disk(machine, &mc, &host, &desired, &root, &services)
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
