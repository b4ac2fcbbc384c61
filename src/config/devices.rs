//! The `devices` key: which of the host's devices a machine gets beside its GPUs.
//!
//! Every category is on by default, as a Kubernetes node on the host would have them: a node
//! agent, device plugin or CSI driver in the machine finds what the host has (the machine is
//! root on the host already: `Capability=all`, so a disk node gives it nothing it could not
//! take). `machines.<name>.devices` overrides `defaults.devices` key by key; `extra` replaces.

use crate::error::bad_input;
use crate::fs::host::HostRoot;
use crate::types::machine_name::MachineName;
use crate::types::paths::HostPath;
use anyhow::{Context as _, Result};
use serde::Deserialize;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

/// `devices` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DevicesSetting {
    kvm: Option<bool>,
    network: Option<bool>,
    infiniband: Option<bool>,
    block: Option<bool>,
    gpudirect: Option<bool>,
    disks: Option<Vec<String>>,
    extra: Option<Vec<String>>,
}

impl DevicesSetting {
    /// `self` with every key `other` sets replaced.
    pub(super) fn overlay(self, other: DevicesSetting) -> DevicesSetting {
        DevicesSetting {
            kvm: other.kvm.or(self.kvm),
            network: other.network.or(self.network),
            infiniband: other.infiniband.or(self.infiniband),
            block: other.block.or(self.block),
            gpudirect: other.gpudirect.or(self.gpudirect),
            disks: other.disks.or(self.disks),
            extra: other.extra.or(self.extra),
        }
    }
}

/// Which host devices a machine gets, every default filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devices {
    /// `/dev/kvm` (KubeVirt, Kata).
    pub kvm: bool,
    /// `/dev/net/tun`, `/dev/vhost-net`, `/dev/vhost-vsock`, and macvtap/ipvtap taps.
    pub network: bool,
    /// `/dev/infiniband` (verbs, MAD, `rdma_cm`): multi-node NCCL, RDMA device plugins.
    pub infiniband: bool,
    /// Disks and partitions the host does not use (local PVs, TopoLVM, Rook): with `disks`,
    /// those; without, every free one when this is the host's only machine, else none.
    pub block: bool,
    /// `disks` as written, each resolved on the host by [`check_on_host`]: the machine's own.
    pub disks: Option<Vec<ExtraNode>>,
    /// No other machine is on the host (installed, or named in the config), filled in by
    /// [`check_on_host`].
    pub sole_machine: bool,
    /// `/dev/gdrdrv` and `/dev/nvidia-fs*` (GDRCopy, GPUDirect Storage).
    pub gpudirect: bool,
    /// More nodes by path, each a character or block device under `/dev`.
    pub extra: Vec<ExtraNode>,
}

impl Devices {
    /// The block devices the config names for this machine: its `disks` and the block nodes
    /// of its `extra` (when disks are on at all for `disks`).
    pub fn named_disks(&self) -> impl Iterator<Item = &ExtraNode> {
        let disks = self.disks.iter().flatten().filter(|_| self.block);
        disks.chain(self.extra.iter().filter(|e| e.block))
    }
}

/// A node of `devices.extra` or `devices.disks`, with what the host has at that path (filled
/// in by [`check_on_host`]; zeros before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraNode {
    /// The config key that names it (`machines.kube1.devices.disks[0]`).
    pub at: String,
    /// As written: a stable `/dev/disk/by-*` name is resolved into `path`.
    pub written: HostPath,
    /// The node itself, bound at this path.
    pub path: HostPath,
    pub block: bool,
    pub major: u32,
    pub minor: u32,
}

/// `devices` at `key` checked: `extra` and `disks` paths under `/dev`, none twice; which nodes
/// they are is checked on the host ([`check_on_host`]).
pub(super) fn check(key: &str, s: Option<&DevicesSetting>) -> Result<Devices> {
    let d = s.cloned().unwrap_or_default();
    let extra = nodes(
        &format!("{key}.devices.extra"),
        d.extra.as_deref().unwrap_or_default(),
    )?;
    let disks = match &d.disks {
        Some(list) => Some(nodes(&format!("{key}.devices.disks"), list)?),
        None => None,
    };
    Ok(Devices {
        kvm: d.kvm.unwrap_or(true),
        network: d.network.unwrap_or(true),
        infiniband: d.infiniband.unwrap_or(true),
        block: d.block.unwrap_or(true),
        gpudirect: d.gpudirect.unwrap_or(true),
        disks,
        sole_machine: false,
        extra,
    })
}

fn nodes(key: &str, list: &[String]) -> Result<Vec<ExtraNode>> {
    let mut out: Vec<ExtraNode> = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let path: HostPath = super::checked_path(&at, p)?;
        if path.strip_prefix("/dev/").is_none_or(|n| n.is_empty()) {
            return Err(bad_input(format!(
                "{at}: \"{path}\" is not under /dev; host directories go in mounts"
            )));
        }
        if out.iter().any(|e| e.written == path) {
            return Err(bad_input(format!("{at}: \"{path}\" is listed twice")));
        }
        out.push(ExtraNode {
            at,
            written: path.clone(),
            path,
            block: false,
            major: 0,
            minor: 0,
        });
    }
    Ok(out)
}

/// Where udev keeps the stable names of disks and partitions: a link there is resolved on the
/// host at every start (the kernel's name of a disk can change between boots; these do not).
const STABLE_DIRS: &[&str] = &[
    "/dev/disk/by-id/",
    "/dev/disk/by-path/",
    "/dev/disk/by-uuid/",
    "/dev/disk/by-partuuid/",
    "/dev/disk/by-label/",
    "/dev/disk/by-partlabel/",
];

/// Each `extra` and `disks` node must be a character or block device on the host now (a
/// `disks` entry a block device), never an NVIDIA or DRM node (those follow the machine's
/// `gpus`), reached without a link but for udev's stable disk names, which are resolved.
///
/// A `disks` entry the host does not have now (a drive pulled, a stable name whose disk is
/// gone) is left out with a warning and the machine starts without it, as a node does without
/// a failed drive: `status` names it once it is back.
pub(super) fn check_on_host(d: &mut Devices, host: &HostRoot) -> Result<()> {
    if let Some(disks) = &mut d.disks {
        disks.retain(|n| {
            let here = host.metadata(n.written.as_str()).is_ok();
            if !here {
                tracing::warn!(
                    "{}: \"{}\" is not on the host now; the machine starts without it",
                    n.at,
                    n.written
                );
            }
            here
        });
    }
    for (node, disk) in nodes_mut(d) {
        check_node(node, disk, host)?;
    }
    Ok(())
}

/// Another machine's named disks as far as they resolve on the host now: one that does not is
/// that machine's error, reported by its own start, not this one's.
pub(super) fn resolved_disks(d: &mut Devices, host: &HostRoot) -> Vec<ExtraNode> {
    let block = d.block;
    nodes_mut(d)
        .filter(|(_, disk)| block || !disk)
        .filter_map(|(node, disk)| check_node(node, disk, host).ok().map(|()| node.clone()))
        .filter(|n| n.block)
        .collect()
}

fn nodes_mut(d: &mut Devices) -> impl Iterator<Item = (&mut ExtraNode, bool)> {
    d.extra
        .iter_mut()
        .map(|n| (n, false))
        .chain(d.disks.iter_mut().flatten().map(|n| (n, true)))
}

fn check_node(node: &mut ExtraNode, disk: bool, host: &HostRoot) -> Result<()> {
    let (at, written) = (node.at.clone(), node.written.clone());
    let what = match host.symlink_metadata(written.as_str()) {
        Err(_) => "does not exist on the host".to_owned(),
        Ok(m) if m.file_type().is_symlink() => {
            if !STABLE_DIRS.iter().any(|d| written.starts_with(d)) {
                "is a symlink; name the node it points at (or a /dev/disk/by-* name)".to_owned()
            } else {
                match resolve_stable(host, &written) {
                    Ok(p) => {
                        node.path = p;
                        String::new()
                    }
                    Err(e) => e,
                }
            }
        }
        Ok(_) => String::new(),
    };
    if !what.is_empty() {
        return Err(bad_input(format!("{at}: \"{written}\" {what}")));
    }
    let path = node.path.clone();
    let shown = if path == written {
        format!("\"{written}\"")
    } else {
        format!("\"{written}\" ({path})")
    };
    let m = host
        .symlink_metadata(path.as_str())
        .map_err(|_| bad_input(format!("{at}: {shown} does not exist on the host")))?;
    let ft = m.file_type();
    if !(ft.is_block_device() || ft.is_char_device() && !disk) {
        let want = if disk {
            "a block device"
        } else {
            "a device node"
        };
        return Err(bad_input(format!("{at}: {shown} is not {want}")));
    }
    node.block = ft.is_block_device();
    node.major = nix::sys::stat::major(m.rdev()) as u32;
    node.minor = nix::sys::stat::minor(m.rdev()) as u32;
    // By name here; by number against the host's NVIDIA and DRM nodes once discovery ran
    // (`model::host_devices::check_named_nodes`).
    let gpu_name = path
        .strip_prefix("/dev/")
        .is_some_and(|n| n.starts_with("nvidia") || n == "dri" || n.starts_with("dri/"));
    if gpu_name {
        return Err(bad_input(format!(
            "{at}: {shown} is an NVIDIA or DRM node ({}:{}), which the machine gets by its gpus",
            node.major, node.minor
        )));
    }
    Ok(())
}

/// The node a stable name under `/dev/disk` points at: one link, to a block device under
/// `/dev` (never out of it, never another link).
fn resolve_stable(host: &HostRoot, link: &HostPath) -> std::result::Result<HostPath, String> {
    let target = host
        .read_link(link.as_str())
        .map_err(|e| format!("cannot be read: {e}"))?;
    let target = target
        .to_str()
        .ok_or_else(|| "points at a name that is not UTF-8".to_owned())?;
    let dir = link.rsplit_once('/').map_or("/", |(d, _)| d);
    let path = crate::types::paths::normalize(dir, target);
    let ok = path.starts_with("/dev/")
        && host
            .symlink_metadata(&path)
            .is_ok_and(|m| m.file_type().is_block_device());
    if !ok {
        return Err(format!(
            "points at {path:?}, which is not a block device under /dev"
        ));
    }
    path.parse()
        .map_err(|e| format!("points at {path:?}, which a .nspawn line cannot carry: {e}"))
}

/// Every machine installed on the host (our drop-in in its unit's drop-in directory), sorted.
pub fn installed_machines(host: &HostRoot) -> Result<Vec<MachineName>> {
    use crate::types::units;
    let entries = match host.read_dir(units::UNIT_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("listing {}", host.path(units::UNIT_DIR).display()));
        }
    };
    let mut out: Vec<MachineName> = entries
        .into_iter()
        .filter_map(|(name, _)| {
            name.to_str()
                .and_then(units::dropin_dir_machine)?
                .parse()
                .ok()
        })
        .filter(|m| host.is_file(units::dropin_path(m)))
        .collect();
    out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Ok(out)
}

impl super::Config {
    /// No disk is named for two machines (exit 2, naming both): each would format it as its own.
    /// A disk is one block device whatever name (`/dev/sdb`, a `/dev/disk/by-id` link) says it.
    pub(super) fn check_disks_disjoint(
        &self,
        host: &HostRoot,
        machine: &MachineName,
        mc: &super::MachineConfig,
    ) -> Result<()> {
        let ours: Vec<&ExtraNode> = mc.devices.named_disks().collect();
        if ours.is_empty() {
            return Ok(());
        }
        for (name, s) in &self.machines {
            if name == machine.as_str() {
                continue;
            }
            let key = format!("machines.{name}");
            let merged = self.defaults.clone().overlay(s.clone());
            let Ok(mut theirs) = self.settings_checked(&key, &merged) else {
                continue;
            };
            for t in &resolved_disks(&mut theirs.devices, host) {
                if let Some(o) = ours
                    .iter()
                    .find(|o| (o.major, o.minor) == (t.major, t.minor))
                {
                    return Err(bad_input(format!(
                        "disk {} is given to both machines {machine} ({}: \"{}\") and {name} \
                         ({}: \"{}\"): each would take it for its own; name it for one of them",
                        o.path, o.at, o.written, t.at, t.written
                    )));
                }
            }
        }
        Ok(())
    }
}
