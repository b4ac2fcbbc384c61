//! The host devices a Kubernetes node uses beyond the GPUs: networking, InfiniBand, disks and
//! GPUDirect, found from the host tree as it is at every pre-start.
//!
//! What the host has is never trusted to be well-formed: a name that would not survive a
//! `.nspawn` line or that leaves `/dev`, a `/dev` entry that is not the node sysfs says it is,
//! a link where a directory belongs: each is skipped with a warning (a node must start whatever
//! odd disk the host has), and a host with more nodes than [`MAX_HOST_DEVICES`] is refused.

use super::Scan;
use crate::discovery::parse;
use crate::discovery::{DeviceCategory, Disk, HostDevice, INFINIBAND_DIR, NodeKind};
use anyhow::Result;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

/// Most host devices of one category discovery takes: far beyond any real host (every
/// partition of 64 NVMe drives of 128 namespaces), yet a bound on the `.nspawn` file.
pub const MAX_HOST_DEVICES: usize = 16384;

/// The RDMA connection manager, a misc device: registered by `rdma_ucm`, its node made by
/// udev's rule only, so a host without that rule has none.
const RDMA_CM: &str = "/dev/infiniband/rdma_cm";
const RDMA_CM_SYSFS: &str = "/sys/class/misc/rdma_cm/dev";

impl Scan<'_> {
    /// Every host device of every category, sorted by category then path (the disks only
    /// where the host does not use them), and every disk with why the host uses it.
    pub(super) fn host_devices(&mut self) -> Result<(Vec<HostDevice>, Vec<Disk>)> {
        let mut out = Vec::new();
        for path in ["/dev/net/tun", "/dev/vhost-net", "/dev/vhost-vsock"] {
            out.extend(self.host_node(DeviceCategory::Network, path, NodeKind::Char)?);
        }
        self.infiniband(&mut out)?;
        let disks = self.disks()?;
        out.extend(
            disks
                .iter()
                .filter(|d| d.used.is_none())
                .map(|d| HostDevice {
                    category: DeviceCategory::Block,
                    path: d.path.clone(),
                    kind: NodeKind::Block,
                    major: d.major,
                    minor: d.minor,
                    create: false,
                }),
        );
        out.extend(self.host_node(DeviceCategory::Gpudirect, "/dev/gdrdrv", NodeKind::Char)?);
        for (name, _) in self.dev_entries()?.iter() {
            if name
                .strip_prefix("nvidia-fs")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            {
                let path = format!("/dev/{name}");
                out.extend(self.host_node(DeviceCategory::Gpudirect, &path, NodeKind::Char)?);
            }
        }
        out.sort();
        Ok((out, disks))
    }

    /// `path` when it is a node of `kind` (never through a link), else `None` (a warning when
    /// something else is there).
    pub(super) fn host_node(
        &mut self,
        category: DeviceCategory,
        path: &str,
        kind: NodeKind,
    ) -> Result<Option<HostDevice>> {
        let Some(m) = self.lstat(path)? else {
            return Ok(None);
        };
        let ft = m.file_type();
        let is = match kind {
            NodeKind::Char => ft.is_char_device(),
            NodeKind::Block => ft.is_block_device(),
        };
        if !is {
            tracing::warn!(
                category = category.as_str(),
                "{path} is not a {} device; not binding it",
                kind.as_str()
            );
            return Ok(None);
        }
        let Ok(path) = super::checked("device node", path.to_owned()) else {
            tracing::warn!("{path:?} cannot be bound by a .nspawn line; not binding it");
            return Ok(None);
        };
        Ok(Some(HostDevice {
            category,
            path,
            kind,
            major: nix::sys::stat::major(m.rdev()) as u32,
            minor: nix::sys::stat::minor(m.rdev()) as u32,
            create: false,
        }))
    }

    /// The verbs, MAD and subnet-manager nodes of `/dev/infiniband` (a real directory, not a
    /// link), and `rdma_cm`: found, or to be made when the kernel registered it without a node.
    fn infiniband(&mut self, out: &mut Vec<HostDevice>) -> Result<()> {
        let c = DeviceCategory::Infiniband;
        let names = match self.lstat(INFINIBAND_DIR)? {
            None => Vec::new(),
            Some(m) if m.is_dir() => self.list(INFINIBAND_DIR)?.unwrap_or_default(),
            Some(_) => {
                tracing::warn!("{INFINIBAND_DIR} is not a directory; not binding InfiniBand");
                return Ok(());
            }
        };
        // Every machine with InfiniBand has this directory bound: what one of them leaves there
        // (files, odd names, a flood of nodes) is skipped with one warning, never a refusal
        // that would stop every machine's start.
        let (mut found, mut junk) = (0, 0);
        for name in &names {
            let numbered = ["uverbs", "umad", "issm"].iter().any(|p| {
                name.strip_prefix(p)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            });
            if !numbered && name != "rdma_cm" {
                continue;
            }
            let path = format!("{INFINIBAND_DIR}/{name}");
            let node = match self.lstat(&path)? {
                Some(m) if m.file_type().is_char_device() => HostDevice {
                    category: c,
                    path: super::checked("device node", path)?,
                    kind: NodeKind::Char,
                    major: nix::sys::stat::major(m.rdev()) as u32,
                    minor: nix::sys::stat::minor(m.rdev()) as u32,
                    create: false,
                },
                Some(_) => {
                    junk += 1;
                    continue;
                }
                None => continue,
            };
            found += 1;
            if found > MAX_HOST_DEVICES {
                continue;
            }
            out.push(node);
        }
        if junk > 0 {
            tracing::warn!(
                "{INFINIBAND_DIR}: skipping {junk} entries that are not character devices (left by a machine?)"
            );
        }
        if found > MAX_HOST_DEVICES {
            tracing::warn!(
                "{INFINIBAND_DIR} holds {found} device nodes, more than {MAX_HOST_DEVICES}; the directory is bound whole, so listing the first {MAX_HOST_DEVICES}"
            );
        }
        if names.iter().any(|n| n == "rdma_cm") {
            return Ok(());
        }
        let Some(bytes) = self.read(RDMA_CM_SYSFS, super::MAX_PROC_FILE)? else {
            return Ok(());
        };
        match parse::dev_numbers(&bytes) {
            Ok((major, minor)) => out.push(HostDevice {
                category: c,
                path: super::checked("device node", RDMA_CM.to_owned())?,
                kind: NodeKind::Char,
                major,
                minor,
                create: true,
            }),
            Err(e) => tracing::warn!("{RDMA_CM_SYSFS}: {e}; not making {RDMA_CM}"),
        }
        Ok(())
    }
}
