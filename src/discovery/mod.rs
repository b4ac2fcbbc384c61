//! Host discovery: what NVIDIA hardware, kernel module and userspace driver the host has right now.
//!
//! Pre-start and post-start share this. Parsers live in [`parse`] and take bytes; only
//! [`discover`] touches the filesystem, always through a [`HostRoot`].

pub mod assign;
pub(crate) mod ldcache;
pub mod parse;
pub(crate) mod runtime;
mod scan;
mod verdict;

use crate::fs::host::HostRoot;
use crate::types::paths::HostPath;
use serde::Serialize;

pub use scan::discover;
pub use verdict::check_complete;

/// Where the InfiniBand verbs, MAD and RDMA CM nodes live; bound as the directory, so a port
/// or HCA the host adds while the machine runs appears in it.
pub(crate) const INFINIBAND_DIR: &str = "/dev/infiniband";

/// Version of the `discover --json` object; bump on any incompatible change.
pub const API_VERSION: &str = "nspawn-lifecycle/v1";

/// Everything discovery saw, in a deterministic order (sorted by path / bus id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// NVIDIA character devices (per-GPU, control, uvm, modeset, caps, IMEX channels, and the
    /// `/dev/dri` nodes that belong to NVIDIA GPUs), sorted by path.
    pub devices: Vec<DeviceNode>,
    /// `/dev/kvm` when it is a real character device.
    pub kvm: Option<DeviceNode>,
    /// The other host devices a Kubernetes node uses (networking, InfiniBand, disks,
    /// GPUDirect), sorted by category then path (`scan/host_devices.rs`).
    pub host_devices: Vec<HostDevice>,
    /// Every disk and partition, each with why the host uses it (`scan/disks.rs`): only the
    /// free ones are among `host_devices`, and a machine never gets another.
    pub disks: Vec<Disk>,
    /// GPUs from `/proc/driver/nvidia/gpus/*/information`, indexed in PCI bus order.
    pub gpus: Vec<Gpu>,
    /// Version from `/proc/driver/nvidia/version`, when the kernel module is loaded.
    pub kernel_module: Option<String>,
    /// Userspace driver files, when `libcuda.so.<version>` was found.
    pub driver: Option<UserspaceDriver>,
    pub verdict: Verdict,
}

/// A character device node on the host.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Absolute host path, e.g. `/dev/nvidia0`; the machine sees it at the same path.
    pub path: HostPath,
    pub major: u32,
    pub minor: u32,
    pub role: DeviceRole,
}

/// What a device node is for; decides where it goes in the CDI spec. Named in `discover`'s text
/// and JSON alike as [`DeviceRole::as_str`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceRole {
    /// `/dev/nvidia<N>`, one per GPU.
    Gpu,
    /// `/dev/nvidiactl`.
    Control,
    /// `/dev/nvidia-uvm`.
    Uvm,
    /// `/dev/nvidia-uvm-tools`.
    UvmTools,
    /// `/dev/nvidia-modeset`.
    Modeset,
    /// `/dev/nvidia-caps/*` (MIG capabilities).
    Cap,
    /// `/dev/nvidia-caps-imex-channels/*`.
    ImexChannel,
    /// `/dev/dri/card*` or `/dev/dri/renderD*` belonging to an NVIDIA GPU.
    Dri,
    /// `/dev/kvm`.
    Kvm,
}

impl DeviceRole {
    /// The name `discover` prints, in its text as in its JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceRole::Gpu => "gpu",
            DeviceRole::Control => "control",
            DeviceRole::Uvm => "uvm",
            DeviceRole::UvmTools => "uvm-tools",
            DeviceRole::Modeset => "modeset",
            DeviceRole::Cap => "cap",
            DeviceRole::ImexChannel => "imex-channel",
            DeviceRole::Dri => "dri",
            DeviceRole::Kvm => "kvm",
        }
    }
}

impl Serialize for DeviceRole {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A host device node beyond the NVIDIA ones and `/dev/kvm`, bound into a machine by category.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostDevice {
    pub category: DeviceCategory,
    /// Absolute host path under `/dev`; the machine sees it at the same path.
    pub path: HostPath,
    #[serde(rename = "type")]
    pub kind: NodeKind,
    pub major: u32,
    pub minor: u32,
    /// Not on the host: the kernel registered it but no node was made (`rdma_cm` without udev's
    /// rule); pre-start makes it before it binds it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub create: bool,
}

/// A disk or partition of the host, and why no machine may get it when the host uses it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// The block node, `/dev/<name>`.
    pub path: HostPath,
    pub major: u32,
    pub minor: u32,
    /// The whole disk a partition is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<HostPath>,
    /// Why the host's own: mounted, swap, held by a dm/md/bcache device, a btrfs or ZFS member,
    /// or on the same disk as one of those. Absent for a free disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used: Option<String>,
}

/// The kinds of host devices a machine gets, each switched by the config's `devices` key; named
/// in JSON as [`DeviceCategory::as_str`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceCategory {
    /// `/dev/net/tun`, `/dev/vhost-net`, `/dev/vhost-vsock`; the `macvtap`/`ipvtap` groups.
    Network,
    /// `/dev/infiniband/{uverbs,umad,issm}*` and `rdma_cm`, bound as the directory.
    Infiniband,
    /// Disks and partitions from `/proc/partitions` (not loop, ram, zram, floppy or optical).
    Block,
    /// `/dev/gdrdrv` (GDRCopy) and `/dev/nvidia-fs*` (GPUDirect Storage).
    Gpudirect,
    /// A node the config's `devices.extra` names.
    Extra,
}

impl DeviceCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceCategory::Network => "network",
            DeviceCategory::Infiniband => "infiniband",
            DeviceCategory::Block => "block",
            DeviceCategory::Gpudirect => "gpudirect",
            DeviceCategory::Extra => "extra",
        }
    }
}

impl Serialize for DeviceCategory {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A device node's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeKind {
    Char,
    Block,
}

impl NodeKind {
    /// The directory of systemd's and udev's numbered links: `char` or `block`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Char => "char",
            NodeKind::Block => "block",
        }
    }
}

/// One NVIDIA GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Position in PCI bus order, starting at 0 (what `nvidia-smi` and CDI index names use).
    pub index: u32,
    /// `Device Minor`: the N of `/dev/nvidia<N>`.
    pub minor: u32,
    /// `GPU UUID`, e.g. `GPU-edfee158-11c1-52b8-0517-92f30e7fac88`.
    pub uuid: String,
    /// PCI bus id as the kernel names it, e.g. `0000:06:00.0`.
    pub bus_id: String,
    pub model: String,
    /// `/dev/nvidia<minor>` when that node exists as a character device.
    pub device: Option<String>,
    /// The GPU's `/dev/dri/{card,renderD}*` nodes, sorted.
    pub dri: Vec<String>,
    /// Minors of its MIG instances' `/dev/nvidia-caps/nvidia-cap<N>` nodes, sorted (from
    /// `/proc/driver/nvidia/capabilities/gpu<minor>/mig`; empty without MIG).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mig_caps: Vec<u32>,
}

/// The userspace driver install found on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserspaceDriver {
    /// Version taken from `libcuda.so.<version>`.
    pub version: String,
    /// Directories holding `libcuda.so.<version>`, in discovery order (native arch first).
    pub lib_dirs: Vec<LibDir>,
    /// Absolute host paths of the driver binaries found (`/usr/bin/nvidia-smi`, …), sorted.
    pub binaries: Vec<HostPath>,
    /// `/lib/firmware/nvidia/<version>` (host path) when present.
    pub firmware: Option<HostPath>,
    /// IPC socket directories that exist (`/run/nvidia-persistenced`, `/run/nvidia-fabricmanager`).
    pub sockets: Vec<HostPath>,
    /// The C runtime the binaries need to run inside the driver root (src/discovery/runtime.rs),
    /// sorted by path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runtime: Vec<RuntimeFile>,
}

/// A host file of the driver tools' C runtime: the loader or a library they need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeFile {
    /// Its absolute path in the driver root: a loader at its `PT_INTERP` path
    /// (`/lib64/ld-linux-x86-64.so.2`), a library at `/usr/lib/<triplet>/<name>`.
    pub path: String,
    /// The host file (canonical: links resolved inside the host root).
    pub source: HostPath,
}

/// A host library directory with driver files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LibDir {
    /// Absolute host path, e.g. `/usr/lib/x86_64-linux-gnu`.
    pub path: HostPath,
    /// Debian multiarch triplet these libraries are for (`x86_64-linux-gnu`, `aarch64-linux-gnu`,
    /// `i386-linux-gnu`); decides `usr/lib/<triplet>` in the driver root and the machine.
    pub triplet: String,
    /// Every `*.so.<version>` here and in `vdpau/`, sorted by name.
    pub files: Vec<DriverFile>,
}

/// One versioned driver library.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverFile {
    /// Path relative to the library directory: `libcuda.so.580.82.07` or
    /// `vdpau/libvdpau_nvidia.so.580.82.07`.
    pub name: String,
    /// ELF `DT_SONAME` (e.g. `libcuda.so.1`), when it has one that differs from `name`.
    pub soname: Option<String>,
}

/// Discovery's judgement of the host's NVIDIA state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum Verdict {
    /// No NVIDIA device nodes: skip GPU work.
    None,
    /// Device nodes, kernel module, and `libcuda` + `libnvidia-ml` of the module's version.
    Complete,
    /// Anything else; each reason names a missing or mismatched piece.
    Incomplete { reasons: Vec<String> },
}

impl Inventory {
    /// The driver, when the verdict is complete.
    pub fn complete_driver(&self) -> Option<&UserspaceDriver> {
        match self.verdict {
            Verdict::Complete => self.driver.as_ref(),
            _ => None,
        }
    }
}

/// `discover --json` output: a versioned object.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub host_root: String,
    #[serde(flatten)]
    pub inventory: &'a Inventory,
    /// Each machine the config names that does not get every GPU: which it gets now.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub assignments: Vec<assign::AssignmentReport>,
}

impl<'a> Report<'a> {
    pub fn new(host: &HostRoot, inventory: &'a Inventory) -> Self {
        Report {
            api_version: API_VERSION,
            kind: "HostDiscovery",
            host_root: host.root().display().to_string(),
            inventory,
            assignments: Vec::new(),
        }
    }
}
