//! The host nodes and directories the `.nspawn` file binds that pre-start must make first: nodes
//! the kernel registered without one (`rdma_cm`), the empty NVIDIA node directories a machine
//! with every GPU binds, and the machine's bpf filesystem.

use super::{Applied, NextStart, Owner, Part};
use crate::apply::boot::Boot;
use crate::model::{Action, Change, Check, host_devices};
use anyhow::{Context as _, Result};

pub struct HostNodes;

/// What the file binds that is missing on the host: nodes and directories (path, and the device
/// numbers of a node), and whether the machine's bpf filesystem is.
#[derive(Debug)]
pub struct Seen {
    pub missing: Vec<(String, Option<(u32, u32)>)>,
    pub bpffs_missing: bool,
}

impl Part for HostNodes {
    type Hook = NextStart;
    type Seen = Seen;
    const NAME: &'static str = "host device nodes";
    const KEY: &'static str = "host-nodes";
    const CHECK: Check = Check::HostDevices;
    const OWNER: Owner = Owner::PreStart;

    fn observe(&self, b: &Boot) -> Result<Seen> {
        let host = &b.ctx.host;
        Ok(Seen {
            missing: wanted(b)
                .into_iter()
                // A directory not there as one is missing (its apply fails on what is there
                // instead); a node, when nothing is at its path (one made meanwhile is left as
                // it is).
                .filter(|(path, numbers)| numbers.is_none() || host.symlink_metadata(path).is_err())
                .collect(),
            bpffs_missing: bpffs_missing(b),
        })
    }

    fn diff(&self, b: &Boot, seen: &Seen, _: &[Change]) -> Result<Vec<Change>> {
        let change = |path: &str, what: String| {
            Change::new(Self::CHECK, Action::Create, path.to_owned(), what)
        };
        let mut out: Vec<Change> = seen
            .missing
            .iter()
            .map(|(path, numbers)| {
                let what = match numbers {
                    Some((major, minor)) => format!("character device {major}:{minor}"),
                    None => "a directory the file binds".to_owned(),
                };
                change(path, what)
            })
            .collect();
        if seen.bpffs_missing {
            let dir = host_devices::bpffs_dir(b.machine);
            out.push(change(&dir, "the machine's bpf filesystem".into()));
        }
        Ok(out)
    }

    /// Make [`wanted`]: directories `0755`, nodes `0666` as udev's rule for `rdma_cm` makes it;
    /// one made meanwhile (udev) is left as it is.
    fn apply(&self, b: &Boot, _: bool) -> Result<Applied> {
        use nix::sys::stat::{Mode, SFlag, fchmodat, makedev, mknodat};
        let host = &b.ctx.host;
        let mut made = Vec::new();
        for (path, numbers) in wanted(b) {
            let Some((major, minor)) = numbers else {
                host.create_dir_all(&path, 0o755)?;
                made.push(path);
                continue;
            };
            let (parent, name) = path.rsplit_once('/').context("a node path has a parent")?;
            let dir = host.create_dir_all(parent, 0o755)?;
            let mode = Mode::from_bits_truncate(0o666);
            let dev = makedev(u64::from(major), u64::from(minor));
            match mknodat(&dir, name, SFlag::S_IFCHR, mode, dev) {
                Ok(()) => {
                    fchmodat(
                        &dir,
                        name,
                        mode,
                        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                    )
                    .with_context(|| format!("chmod {path}"))?;
                    made.push(format!("{path} ({major}:{minor})"));
                }
                Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(e).with_context(|| format!("mknod {path}")),
            }
        }
        made.extend(make_bpffs(b)?);
        Ok(Applied::line(format!(
            "host device nodes made: {}",
            made.join(" ")
        )))
    }

    fn unchanged(&self, _: &Boot) -> Result<String> {
        Ok("host device nodes: none missing".to_owned())
    }
}

/// The host paths the `.nspawn` file binds that pre-start must make first: the empty NVIDIA node
/// directories ([`host_devices::NVIDIA_NODE_DIRS`], a machine with every GPU) and the nodes
/// discovery found registered without one; (path, device numbers for a node).
fn wanted(b: &Boot) -> Vec<(String, Option<(u32, u32)>)> {
    let rendered = b.rendered.borrow();
    let start = rendered.start();
    let mut out = Vec::new();
    if start.assignment.view.complete_driver().is_some() {
        for (dir, role) in host_devices::NVIDIA_NODE_DIRS {
            if host_devices::nvidia_dir_bound(&start.assignment.setting, role)
                && !b.ctx.host.is_dir(dir)
            {
                out.push((dir.to_owned(), None));
            }
        }
    }
    for d in start.devices.iter().filter(|d| d.create) {
        out.push((d.path.to_string(), Some((d.major, d.minor))));
    }
    out
}

/// Whether the machine's bpf filesystem ([`host_devices::bpffs_dir`]) is missing: no directory,
/// or (on the real host, where pre-start mounts) not a bpf filesystem.
fn bpffs_missing(b: &Boot) -> bool {
    let dir = host_devices::bpffs_dir(b.machine);
    match crate::fs::host_dir::check(&b.ctx.host, &dir, 0o700) {
        Err(_) | Ok(None) => true,
        Ok(Some(d)) => {
            b.ctx.host.is_real_root() && !crate::fs::fd_mount::is_bpffs(d.fd()).unwrap_or(false)
        }
    }
}

/// The machine's bpf filesystem made: its directory (`0700`), and on the real host a bpf
/// filesystem mounted there unless one is. Every component is checked as the lock directory's
/// are (`host_dir`: no link, ours, nobody else may write), so no one but root decides where the
/// mount goes.
fn make_bpffs(b: &Boot) -> Result<Option<String>> {
    if !bpffs_missing(b) {
        return Ok(None);
    }
    let dir = host_devices::bpffs_dir(b.machine);
    let d = crate::fs::host_dir::open(&b.ctx.host, &dir, 0o700)?;
    let fd = d.fd();
    if b.ctx.host.is_real_root() && !crate::fs::fd_mount::is_bpffs(fd)? {
        crate::fs::fd_mount::mount_bpffs_onto(fd)?;
        return Ok(Some(format!("bpf filesystem mounted at {dir}")));
    }
    Ok(Some(format!("{dir} made")))
}
