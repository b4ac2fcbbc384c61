//! The host's disks and partitions, and which of them the host uses itself.
//!
//! A machine cannot see the host's mounts, so a storage operator in it (Rook with
//! `useAllDevices`, OpenEBS NDM, a local-PV provisioner, TopoLVM) takes any disk it is given for
//! free and formats it. So a disk the host uses is never among the disks a machine may get:
//!
//! - mounted in the host's mount namespace (`/proc/1/mountinfo`, by device number, and by the
//!   mount source for filesystems such as btrfs that show an anonymous device number),
//! - swap (`/proc/swaps`),
//! - held by another block device: a member (`slaves/`) of a device-mapper target (LVM, dm-crypt,
//!   multipath), an md array or a bcache device, so a mounted LV makes its physical volumes used,
//!   and so does an assembled array its members,
//! - a member of a btrfs filesystem the kernel knows (`/sys/fs/btrfs/<fsid>/devices/<name>`),
//! - a ZFS pool member (udev's `ID_FS_TYPE=zfs_member`) on a host with ZFS loaded: the kernel
//!   shows no holder for a vdev, so with ZFS loaded every member is taken for the host's;
//! - and any partition of a disk that is used, or the disk of a used partition: the whole disk
//!   is the host's then.
//!
//! Every block device with a size is one line of `/proc/partitions` (numbers and kernel name),
//! read once; a partition's disk follows from the kernel's naming rule; its node's type comes
//! from one listing of the host's `/dev`. Only device mapper, md and bcache devices are read
//! further (their members, `/sys/block/<name>/slaves`): a host with hundreds of partitions
//! costs no system call per partition.

use super::Scan;
use crate::discovery::{DeviceCategory, Disk, HostDevice, NodeKind};
use crate::fs::machine_root::FileKind;
use crate::types::paths::HostPath;
use anyhow::{Result, bail};
use std::collections::{BTreeMap, BTreeSet};

/// Most disks and partitions discovery takes: far beyond any real host (every partition of 64
/// NVMe drives of 128 namespaces), yet a bound on the `.nspawn` file.
pub const MAX_DISKS: usize = super::host_devices::MAX_HOST_DEVICES;

/// Every block device with a size: numbers and kernel name, one read for the whole host.
const PARTITIONS: &str = "/proc/partitions";
/// About 16,384 lines of the kernel's format, and room to spare.
const MAX_PARTITIONS: u64 = 4 << 20;
/// Whole disks (device mapper and md devices among them), each with `slaves/`.
const SYS_BLOCK: &str = "/sys/block";
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
/// Block devices made of others, whose `slaves/` lists their members: device mapper (LVM,
/// dm-crypt, multipath), md arrays, bcache. The kernel links a holder only from these.
const HOLDERS: &[&str] = &["dm-", "md", "bcache"];

/// A block device `/proc/partitions` lists, before its use is judged.
struct Candidate {
    /// The kernel's name (`sda1`, `cciss!c0d0`: sysfs writes a `/` of it as `!`).
    name: String,
    major: u32,
    minor: u32,
    /// Its node, when `/dev/<name>` is one with these numbers: only such a device is listed
    /// (and can be bound), but every one counts toward its disk's use.
    device: Option<HostDevice>,
    /// The kernel name of the disk a partition is on.
    parent: Option<String>,
}

impl Scan<'_> {
    /// Every disk and partition, sorted by path, each with why the host uses it.
    pub(super) fn disks(&mut self) -> Result<Vec<Disk>> {
        let found = self.block_devices()?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let by_number = self.used_by_number()?;
        let held = self.held(&found)?;
        let btrfs = self.btrfs_members()?;
        let zfs = self.lstat(ZFS_MODULE)?.is_some();
        let mut own: BTreeMap<&str, String> = BTreeMap::new();
        for c in &found {
            let reason = if let Some(r) = by_number.get(&(c.major, c.minor)) {
                Some(r.clone())
            } else if let Some(by) = held.get(c.name.as_str()) {
                let by: Vec<&str> = by.iter().map(String::as_str).collect();
                Some(format!(
                    "held by {} (device mapper, LVM, md or bcache)",
                    by.join(", ")
                ))
            } else if let Some(fsid) = btrfs.get(&c.name) {
                Some(format!("a member of the btrfs filesystem {fsid}"))
            } else if zfs && self.zfs_member(c.major, c.minor)? {
                Some("a ZFS pool member (the host has ZFS loaded)".to_owned())
            } else {
                None
            };
            if let Some(r) = reason {
                own.insert(&c.name, r);
            }
        }
        // The whole disk is the host's when it or any of its partitions is.
        let disk_of = |c: &Candidate| c.parent.clone().unwrap_or_else(|| c.name.clone());
        let mut family: BTreeMap<String, String> = BTreeMap::new();
        for c in &found {
            if let Some(r) = own.get(c.name.as_str()) {
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
                        .get(c.name.as_str())
                        .or_else(|| family.get(&disk_of(c)))
                        .cloned(),
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Every block device of `/proc/partitions` that is storage, with its node when `/dev` has
    /// a block device at its name.
    fn block_devices(&mut self) -> Result<Vec<Candidate>> {
        let Some(bytes) = self.read(PARTITIONS, MAX_PARTITIONS)? else {
            return Ok(Vec::new());
        };
        let mut entries: Vec<(String, u32, u32)> = Vec::new();
        for (major, minor, name) in crate::discovery::parse::proc_partitions(&bytes) {
            // `loop0`, `loop0p1`, `sr0`: never storage, partitions of them neither.
            if NOT_STORAGE.iter().any(|p| {
                name.strip_prefix(p)
                    .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
            }) {
                continue;
            }
            // The sysfs form of the name (`/` written `!`), as btrfs and /sys/block name it.
            entries.push((name.replace('/', "!"), major, minor));
        }
        if entries.len() > MAX_DISKS {
            bail!(
                "{PARTITIONS} lists {} disks and partitions, more than {MAX_DISKS}; refusing to bind them",
                entries.len()
            );
        }
        let names: BTreeSet<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        let dev = self.dev_entries()?;
        let mut out = Vec::with_capacity(entries.len());
        for (name, major, minor) in &entries {
            let (major, minor) = (*major, *minor);
            let parent = disk_of_partition(name, &names).map(str::to_owned);
            let path = format!("/dev/{}", name.replace('!', "/"));
            if path[5..]
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == ".." || c.contains(['\n', '\r']))
            {
                tracing::warn!("{PARTITIONS} names {name:?}, no path under /dev; skipping it");
                continue;
            }
            let device = self.block_node(&dev, name, path, major, minor)?;
            out.push(Candidate {
                name: name.clone(),
                major,
                minor,
                device,
                parent,
            });
        }
        Ok(out)
    }

    /// The device `name` (at `path`) as a host device when `/dev` has a block node there: its
    /// type from the listing of /dev (`dev`), a lookup only for a name with a directory
    /// (`cciss/c0d0`). Its numbers need no stat: the device cgroup allows this device's numbers
    /// alone, so another node at the path would not open.
    fn block_node(
        &mut self,
        dev: &[(String, FileKind)],
        name: &str,
        path: String,
        major: u32,
        minor: u32,
    ) -> Result<Option<HostDevice>> {
        let kind = if name.contains('!') {
            self.lstat(&path)?.map(|m| {
                use std::os::unix::fs::FileTypeExt as _;
                if m.file_type().is_block_device() {
                    FileKind::BlockDevice
                } else {
                    FileKind::File
                }
            })
        } else {
            dev.binary_search_by(|(n, _)| n.as_str().cmp(name))
                .ok()
                .map(|i| dev[i].1)
        };
        Ok(match kind {
            None => None,
            Some(FileKind::BlockDevice) => match HostPath::try_from(path.clone()) {
                Ok(path) => Some(HostDevice {
                    category: DeviceCategory::Block,
                    path,
                    kind: NodeKind::Block,
                    major,
                    minor,
                    create: false,
                }),
                Err(_) => {
                    tracing::warn!("{path:?} cannot be bound by a .nspawn line; not binding it");
                    None
                }
            },
            Some(_) => {
                tracing::warn!("{path} is not a block device; not binding it");
                None
            }
        })
    }

    /// The members of every device mapper, md and bcache device: member name → holders.
    fn held(&mut self, found: &[Candidate]) -> Result<BTreeMap<String, Vec<String>>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for c in found {
            if c.parent.is_some() || !HOLDERS.iter().any(|p| c.name.starts_with(p)) {
                continue;
            }
            let slaves = format!("{SYS_BLOCK}/{}/slaves", c.name);
            for member in self.list(&slaves)?.unwrap_or_default() {
                out.entry(member).or_default().push(c.name.clone());
            }
        }
        Ok(out)
    }

    /// What the host's mounts and swap use, by device number, with why.
    fn used_by_number(&mut self) -> Result<BTreeMap<(u32, u32), String>> {
        let mut out = BTreeMap::new();
        let mounts = self
            .read(MOUNTINFO, MAX_MOUNTINFO)?
            .map(|b| crate::discovery::parse::mountinfo(&b))
            .unwrap_or_default();
        let mut sources = BTreeSet::new();
        for m in &mounts {
            let why = || format!("mounted at {}", m.mount_point.escape_debug());
            if m.major != 0 {
                out.entry((m.major, m.minor)).or_insert_with(why);
            }
            // btrfs (and others) show an anonymous 0:N; their source names the device. Each
            // source is resolved once (a node's pods mount the same device many times).
            if m.source.starts_with("/dev/")
                && sources.insert(m.source.clone())
                && let Some(n) = self.block_numbers(&m.source)?
            {
                out.entry(n).or_insert_with(why);
            }
        }
        let swaps = self
            .read(SWAPS, super::MAX_PROC_FILE)?
            .map(|b| crate::discovery::parse::swaps(&b))
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
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        Ok(self.resolve(path)?.and_then(|(_, m)| {
            m.file_type().is_block_device().then(|| {
                (
                    nix::sys::stat::major(m.rdev()) as u32,
                    nix::sys::stat::minor(m.rdev()) as u32,
                )
            })
        }))
    }

    /// The members of every btrfs filesystem the kernel knows: kernel name → filesystem id.
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

/// The disk `name` is a partition of, by the kernel's naming rule (`disk_name()`): the disk's
/// name and the partition number, with a `p` between when the disk's name ends in a digit
/// (`sda` → `sda1`, `nvme0n1` → `nvme0n1p1`, `mmcblk0` → `mmcblk0p1`; `nvme0n10` is a disk of
/// its own). `names` are the host's block devices.
fn disk_of_partition<'a>(name: &str, names: &BTreeSet<&'a str>) -> Option<&'a str> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let stem = &name[..name.len() - digits];
    let (disk, needs_p) = match stem.strip_suffix('p') {
        Some(d) if d.ends_with(|c: char| c.is_ascii_digit()) => (d, true),
        _ => (stem, false),
    };
    let found = names.get(disk).copied()?;
    let ends_in_digit = disk.ends_with(|c: char| c.is_ascii_digit());
    (ends_in_digit == needs_p && !disk.is_empty()).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::disk_of_partition;

    #[test]
    fn partitions_by_the_kernels_naming_rule() {
        let names = [
            "sda",
            "sda1",
            "sdaa",
            "nvme0n1",
            "nvme0n1p2",
            "nvme0n10",
            "mmcblk0",
            "mmcblk0p1",
            "md0",
            "md0p1",
            "dm-0",
            "cciss!c0d0",
            "cciss!c0d0p1",
            "vda",
            "vda15",
        ]
        .into_iter()
        .collect();
        let p = |n| disk_of_partition(n, &names);
        assert_eq!(p("sda1"), Some("sda"));
        assert_eq!(p("vda15"), Some("vda"));
        assert_eq!(p("nvme0n1p2"), Some("nvme0n1"));
        assert_eq!(p("mmcblk0p1"), Some("mmcblk0"));
        assert_eq!(p("md0p1"), Some("md0"));
        assert_eq!(p("cciss!c0d0p1"), Some("cciss!c0d0"));
        for disk in [
            "sda", "sdaa", "nvme0n1", "nvme0n10", "mmcblk0", "md0", "dm-0", "vda",
        ] {
            assert_eq!(p(disk), None, "{disk}");
        }
    }
}
