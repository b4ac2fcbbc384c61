//! The host's disks and partitions, and which of them the host uses itself.
//!
//! A machine cannot see the host's mounts, so a storage operator in it (Rook with
//! `useAllDevices`, OpenEBS NDM, a local-PV provisioner, TopoLVM) takes any disk it is given for
//! free and formats it. So a disk the host uses is never among the disks a machine may get:
//!
//! - mounted in the host's mount namespace (`/proc/1/mountinfo`, by device number, and by the
//!   mount source for filesystems such as btrfs that show an anonymous device number),
//! - swap (`/proc/swaps`),
//! - held by another block device (`/sys/class/block/<name>/holders`: a device-mapper target,
//!   LVM, md RAID, bcache), so a mounted LV makes its physical volumes used, and so does an
//!   assembled array its members,
//! - a member of a btrfs filesystem the kernel knows (`/sys/fs/btrfs/<fsid>/devices/<name>`),
//! - a ZFS pool member (udev's `ID_FS_TYPE=zfs_member`) on a host with ZFS loaded: the kernel
//!   shows no holder for a vdev, so with ZFS loaded every member is taken for the host's;
//! - and any partition of a disk that is used, or the disk of a used partition: the whole disk
//!   is the host's then.

use super::Scan;
use crate::discovery::{DeviceCategory, Disk, HostDevice, NodeKind, parse};
use anyhow::{Result, bail};
use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

/// Most disks and partitions discovery takes: far beyond any real host (every partition of 64
/// NVMe drives of 128 namespaces), yet a bound on the `.nspawn` file.
pub const MAX_DISKS: usize = super::host_devices::MAX_HOST_DEVICES;

const BLOCK_CLASS: &str = "/sys/class/block";
/// The host's mount namespace: PID 1's, whichever namespace the helper runs in.
const MOUNTINFO: &str = "/proc/1/mountinfo";
const SWAPS: &str = "/proc/swaps";
const BTRFS: &str = "/sys/fs/btrfs";
const ZFS_MODULE: &str = "/sys/module/zfs";
/// Largest mountinfo read: about 80,000 mounts, far beyond a node with every pod's volumes.
const MAX_MOUNTINFO: u64 = 16 << 20;
/// Block devices that are not storage a node consumes: loop files (the host's own images),
/// RAM disks, compressed swap, floppies and optical drives.
const NOT_STORAGE: &[&str] = &["loop", "ram", "zram", "fd", "sr"];

/// A block device sysfs lists, before its use is judged.
struct Candidate {
    /// The sysfs name (`cciss!c0d0`).
    name: String,
    major: u32,
    minor: u32,
    /// Its node, when `/dev/<name>` is one with sysfs's numbers: only such a device is listed
    /// (and can be bound), but every one counts toward its disk's use.
    device: Option<HostDevice>,
    /// The sysfs name of the disk a partition is on.
    parent: Option<String>,
    holders: Vec<String>,
}

impl Scan<'_> {
    /// Every disk and partition, sorted by path, each with why the host uses it.
    pub(super) fn disks(&mut self) -> Result<Vec<Disk>> {
        let found = self.block_devices()?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let by_number = self.used_by_number()?;
        let btrfs = self.btrfs_members()?;
        let zfs = self.lstat(ZFS_MODULE)?.is_some();
        let mut own: BTreeMap<String, String> = BTreeMap::new();
        for c in &found {
            let reason = if let Some(r) = by_number.get(&(c.major, c.minor)) {
                Some(r.clone())
            } else if !c.holders.is_empty() {
                Some(format!(
                    "held by {} (device mapper, LVM, md or bcache)",
                    c.holders.join(", ")
                ))
            } else if let Some(fsid) = btrfs.get(&c.name) {
                Some(format!("a member of the btrfs filesystem {fsid}"))
            } else if zfs && self.zfs_member(c.major, c.minor)? {
                Some("a ZFS pool member (the host has ZFS loaded)".to_owned())
            } else {
                None
            };
            if let Some(r) = reason {
                own.insert(c.name.clone(), r);
            }
        }
        // The whole disk is the host's when it or any of its partitions is.
        let disk_of = |c: &Candidate| c.parent.clone().unwrap_or_else(|| c.name.clone());
        let mut family: BTreeMap<String, String> = BTreeMap::new();
        for c in &found {
            if let Some(r) = own.get(&c.name) {
                family.entry(disk_of(c)).or_insert_with(|| {
                    format!("/dev/{} on the same disk is {r}", c.name.replace('!', "/"))
                });
            }
        }
        let mut out: Vec<Disk> = found
            .iter()
            .filter_map(|c| {
                let d = c.device.as_ref()?;
                Some(Disk {
                    path: d.path.clone(),
                    major: c.major,
                    minor: c.minor,
                    disk: c
                        .parent
                        .as_ref()
                        .and_then(|p| format!("/dev/{}", p.replace('!', "/")).parse().ok()),
                    used: own
                        .get(&c.name)
                        .or_else(|| family.get(&disk_of(c)))
                        .cloned(),
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Every `/sys/class/block` entry that is storage, at `/dev/<name>` (sysfs writes a `/` of
    /// the device name as `!`) when a block node with the numbers of its `dev` file is there.
    fn block_devices(&mut self) -> Result<Vec<Candidate>> {
        let names: Vec<String> = self
            .list(BLOCK_CLASS)?
            .unwrap_or_default()
            .into_iter()
            .filter(|name| {
                !NOT_STORAGE.iter().any(|p| {
                    name.strip_prefix(p)
                        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                })
            })
            .collect();
        if names.len() > MAX_DISKS {
            bail!(
                "{BLOCK_CLASS} holds {} disks and partitions, more than {MAX_DISKS}; refusing to bind them",
                names.len()
            );
        }
        let mut out = Vec::new();
        for name in names {
            let dev = name.replace('!', "/");
            if dev
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == ".." || c.contains(['\n', '\r']))
            {
                tracing::warn!("{BLOCK_CLASS}/{name:?} names no path under /dev; skipping it");
                continue;
            }
            let class = format!("{BLOCK_CLASS}/{name}");
            let numbers = match self.read(&format!("{class}/dev"), 64) {
                Ok(Some(b)) => parse::dev_numbers(&b),
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("{class:?}: {e:#}; skipping it");
                    continue;
                }
            };
            let Ok((major, minor)) = numbers else {
                tracing::warn!("{class:?}/dev is not \"<major>:<minor>\"; skipping it");
                continue;
            };
            let path = format!("/dev/{dev}");
            let device = match self.host_node(DeviceCategory::Block, &path, NodeKind::Block)? {
                Some(d) if (d.major, d.minor) == (major, minor) => Some(d),
                Some(d) => {
                    tracing::warn!(
                        "{path} is {}:{}, not {major}:{minor} as {class} says; not binding it",
                        d.major,
                        d.minor
                    );
                    None
                }
                None => None,
            };
            let parent = self.parent_disk(&class)?;
            let holders = self.list(&format!("{class}/holders"))?.unwrap_or_default();
            out.push(Candidate {
                name,
                major,
                minor,
                device,
                parent,
                holders,
            });
        }
        Ok(out)
    }

    /// The sysfs name of the disk a partition (`<class>/partition` exists) is on: the directory
    /// above it in the device tree `<class>` links to.
    fn parent_disk(&mut self, class: &str) -> Result<Option<String>> {
        if self.lstat(&format!("{class}/partition"))?.is_none() {
            return Ok(None);
        }
        let Ok(target) = self.host.read_link(class) else {
            return Ok(None);
        };
        let comps: Vec<&str> = target
            .to_str()
            .unwrap_or("")
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        Ok(match comps.as_slice() {
            [.., disk, _] if *disk != ".." => Some((*disk).to_owned()),
            _ => None,
        })
    }

    /// What the host's mounts and swap use, by device number, with why.
    fn used_by_number(&mut self) -> Result<BTreeMap<(u32, u32), String>> {
        let mut out = BTreeMap::new();
        let mounts = self
            .read(MOUNTINFO, MAX_MOUNTINFO)?
            .map(|b| parse::mountinfo(&b))
            .unwrap_or_default();
        for m in &mounts {
            let why = || format!("mounted at {}", m.mount_point.escape_debug());
            if m.major != 0 {
                out.entry((m.major, m.minor)).or_insert_with(why);
            }
            // btrfs (and others) show an anonymous 0:N; their source names the device.
            if m.source.starts_with("/dev/")
                && let Some(n) = self.block_numbers(&m.source)?
            {
                out.entry(n).or_insert_with(why);
            }
        }
        let swaps = self
            .read(SWAPS, super::MAX_PROC_FILE)?
            .map(|b| parse::swaps(&b))
            .unwrap_or_default();
        for f in swaps {
            if let Some(n) = self.block_numbers(&f)? {
                out.entry(n).or_insert_with(|| "in use as swap".to_owned());
            }
        }
        Ok(out)
    }

    /// The device numbers of the block node `path` resolves to on the host.
    fn block_numbers(&mut self, path: &str) -> Result<Option<(u32, u32)>> {
        Ok(self.resolve(path)?.and_then(|(_, m)| {
            m.file_type().is_block_device().then(|| {
                (
                    nix::sys::stat::major(m.rdev()) as u32,
                    nix::sys::stat::minor(m.rdev()) as u32,
                )
            })
        }))
    }

    /// The members of every btrfs filesystem the kernel knows: sysfs name → filesystem id.
    fn btrfs_members(&mut self) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for fsid in self.list(BTRFS)?.unwrap_or_default() {
            if fsid == "features" {
                continue;
            }
            for dev in self
                .list(&format!("{BTRFS}/{fsid}/devices"))?
                .unwrap_or_default()
            {
                out.entry(dev).or_insert_with(|| fsid.clone());
            }
        }
        Ok(out)
    }

    /// Whether udev found a ZFS label on the block device `major:minor`.
    fn zfs_member(&mut self, major: u32, minor: u32) -> Result<bool> {
        let db = format!("/run/udev/data/b{major}:{minor}");
        Ok(match self.read(&db, 1 << 16) {
            Ok(Some(b)) => String::from_utf8_lossy(&b)
                .lines()
                .any(|l| l == "E:ID_FS_TYPE=zfs_member"),
            Ok(None) => false,
            Err(e) => {
                tracing::warn!("{db}: {e:#}; taking the disk for a ZFS member");
                true
            }
        })
    }
}
