//! The `devices` key: which of the host's devices a machine gets beside its GPUs.
//!
//! Every category is on by default, as a Kubernetes node on the host would have them: a node
//! agent, device plugin or CSI driver in the machine finds what the host has (the machine is
//! root on the host already: `Capability=all`, so a disk node gives it nothing it could not
//! take). `machines.<name>.devices` overrides `defaults.devices` key by key; `extra` replaces.

use crate::error::bad_input;
use crate::fs::host::HostRoot;
use crate::types::paths::HostPath;
use anyhow::Result;
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
    /// Disks and partitions (local PVs, TopoLVM, Rook).
    pub block: bool,
    /// `/dev/gdrdrv` and `/dev/nvidia-fs*` (GDRCopy, GPUDirect Storage).
    pub gpudirect: bool,
    /// More nodes by path, each a character or block device under `/dev`.
    pub extra: Vec<ExtraNode>,
}

/// A node of `devices.extra`, with what the host has at that path (filled in by
/// [`check_on_host`]; zeros before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraNode {
    pub path: HostPath,
    pub block: bool,
    pub major: u32,
    pub minor: u32,
}

/// `devices` at `key` checked: `extra` paths under `/dev`, none an NVIDIA or DRM node (those
/// follow the machine's `gpus`), none twice.
pub(super) fn check(key: &str, s: Option<&DevicesSetting>) -> Result<Devices> {
    let d = s.cloned().unwrap_or_default();
    let mut extra: Vec<ExtraNode> = Vec::new();
    for (i, p) in d.extra.unwrap_or_default().iter().enumerate() {
        let at = format!("{key}.devices.extra[{i}]");
        let path: HostPath = super::checked_path(&at, p)?;
        let Some(name) = path.strip_prefix("/dev/").filter(|n| !n.is_empty()) else {
            return Err(bad_input(format!(
                "{at}: \"{path}\" is not under /dev; host directories go in mounts"
            )));
        };
        if name.starts_with("nvidia") || name == "dri" || name.starts_with("dri/") {
            return Err(bad_input(format!(
                "{at}: \"{path}\" is an NVIDIA or DRM node, which the machine gets by its gpus"
            )));
        }
        if extra.iter().any(|e| e.path == path) {
            return Err(bad_input(format!("{at}: \"{path}\" is listed twice")));
        }
        extra.push(ExtraNode {
            path,
            block: false,
            major: 0,
            minor: 0,
        });
    }
    Ok(Devices {
        kvm: d.kvm.unwrap_or(true),
        network: d.network.unwrap_or(true),
        infiniband: d.infiniband.unwrap_or(true),
        block: d.block.unwrap_or(true),
        gpudirect: d.gpudirect.unwrap_or(true),
        extra,
    })
}

/// Each `extra` node must be a character or block device on the host now, not a link (a link
/// would be bound as what it points at, which the config does not name).
pub(super) fn check_on_host(key: &str, d: &mut Devices, host: &HostRoot) -> Result<()> {
    for (i, node) in d.extra.iter_mut().enumerate() {
        let at = format!("{key}.devices.extra[{i}]");
        let path = &node.path;
        let what = match host.symlink_metadata(path.as_str()) {
            Err(_) => "does not exist on the host",
            Ok(m) if m.file_type().is_symlink() => "is a symlink; name the node it points at",
            Ok(m) if m.file_type().is_char_device() || m.file_type().is_block_device() => {
                node.block = m.file_type().is_block_device();
                node.major = nix::sys::stat::major(m.rdev()) as u32;
                node.minor = nix::sys::stat::minor(m.rdev()) as u32;
                continue;
            }
            Ok(_) => "is not a device node",
        };
        return Err(bad_input(format!("{at}: \"{path}\" {what}")));
    }
    Ok(())
}
