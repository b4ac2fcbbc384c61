//! Walks the host tree (through a `HostRoot`) and builds an `Inventory`.
//!
//! # Malformed /proc and /sys files
//!
//! A /proc or /sys file that exists but cannot be understood (truncated, garbage, not UTF-8, a
//! bus id that disagrees with its directory, a vendor that is not NVIDIA's) is a *reason* in an
//! `incomplete` verdict, naming the file and what is wrong with it. Such files appear while a
//! driver is being loaded or replaced, and `incomplete` makes pre-start fail with exit code 3 so
//! systemd retries the start until the host settles; a hard error would look like a bug in us.
//! Only what we cannot read at all is an error (exit 1, naming the file): an I/O error, a
//! directory where a file belongs, a FIFO or device node where a file belongs, or a file over
//! [`MAX_PROC_FILE`] (real ones are a few hundred bytes; a huge one is not a driver file and is
//! not worth reading into memory).
//!
//! Reasons only matter when the host has NVIDIA hardware: with no NVIDIA device nodes and no GPU
//! in /proc the verdict is `none` and they are logged at debug level.
//!
//! Directory entries whose names are not UTF-8 are skipped (debug log): no NVIDIA file has one.

use super::parse::{self, PciAddress};
use super::{DeviceNode, DeviceRole, DriverFile, Gpu, Inventory, LibDir, UserspaceDriver, Verdict};
use crate::fs::host::HostRoot;
use crate::fs::machine_root::FileKind;
use crate::types::paths::HostPath;
use anyhow::{Context as _, Result, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::Metadata;
use std::io::{ErrorKind, Read as _};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

/// Largest /proc or /sys file discovery reads.
pub const MAX_PROC_FILE: u64 = 1 << 20;
/// Largest `/etc/ld.so.cache` discovery reads (Debian's is ~100 KiB with thousands of libraries).
pub const MAX_LD_CACHE: u64 = 16 << 20;

const VERSION_FILE: &str = "/proc/driver/nvidia/version";
const GPUS_DIR: &str = "/proc/driver/nvidia/gpus";
/// Per-GPU MIG capabilities (`gpu<minor>/mig/gi<N>/access`, `…/ci<M>/access`).
const CAPS_DIR: &str = "/proc/driver/nvidia/capabilities";
const PCI_DIR: &str = "/sys/bus/pci/devices";
const LD_CACHE: &str = "/etc/ld.so.cache";

/// Where driver libraries live when ld.so.cache does not say (NVIDIA's own search list, see
/// research §2.3), plus the i386 multiarch dirs for 32-bit compatibility libraries.
const STANDARD_LIB_DIRS: &[&str] = &[
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    // Where GKE's driver installer and NVIDIA's legacy container runtime put the driver (a
    // directory of its own, often a read-only mount, outside the loader's cache).
    "/usr/local/nvidia/lib64",
    "/usr/lib/i386-linux-gnu",
    "/usr/lib/i386-linux-gnu/nvidia/current",
    "/lib/i386-linux-gnu",
    "/usr/local/nvidia/lib",
];

/// Binaries carried into the machine, and the directories searched for them, in order.
const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    // The IMEX daemon and its control tool, which the ComputeDomain daemon pods of NVIDIA's DRA
    // driver run from the driver root on multi-node NVLink hosts.
    "nvidia-imex",
    "nvidia-imex-ctl",
];
const BIN_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/usr/local/nvidia/bin",
];

/// IPC directories bound when they hold a `socket`.
const SOCKET_DIRS: &[&str] = &["/run/nvidia-persistenced", "/run/nvidia-fabricmanager"];

/// Most NVIDIA device nodes discovery takes. The most a driver makes is a few thousand (MIG
/// capabilities of 32 GPUs are 4 322 nodes, IMEX channels 2 048); each node becomes a line of
/// the `.nspawn` file and an entry of the CDI spec.
pub const MAX_DEVICE_NODES: usize = 16384;

/// How many different `libcuda.so*` paths of ld.so.cache are looked at. A host has one or two
/// per architecture; a cache with thousands would cost thousands of walks through the tree.
const MAX_CACHED_LIBCUDA: usize = 64;

/// Longest path the kernel takes, with its NUL.
const PATH_MAX: usize = libc::PATH_MAX as usize;

/// How many symlinks one path may traverse (Linux's limit).
const MAX_SYMLINKS: usize = 40;

/// The stem (`libnvidia-api`) of a driver library whose file name does not end in the driver
/// version, `None` for any other name. What NVIDIA's installer and Debian's packages ship under
/// such names, and `nvidia-ctk cdi generate` mounts (research §2.3, tests/realdriver.rs):
/// `libnvidia-api.so.1` (545 and later), `libnvidia-nvvm70.so.4` (the older NVVM beside the
/// current one, 570 and later) and the EGL external platform libraries, whose versions are their
/// own (`libnvidia-egl-gbm.so.1.1.2`, `libnvidia-egl-wayland.so.1.1.18`, `-wayland2`, `-xcb`,
/// `-xlib`). Their SONAME links (`libnvidia-egl-gbm.so.1`) come from the ELF as for the others.
fn unversioned_driver_lib(name: &str) -> Option<&str> {
    let (stem, rest) = name.split_once(".so.")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ok = match stem {
        "libnvidia-api" => rest == "1",
        "libnvidia-nvvm70" => digits(rest),
        "libnvidia-egl-gbm"
        | "libnvidia-egl-wayland"
        | "libnvidia-egl-wayland2"
        | "libnvidia-egl-xcb"
        | "libnvidia-egl-xlib" => parse::is_version(rest),
        _ => false,
    };
    ok.then_some(stem)
}

/// Discover the host's NVIDIA state.
pub fn discover(host: &HostRoot) -> Result<Inventory> {
    let mut s = Scan {
        host,
        reasons: Vec::new(),
        listings: BTreeMap::new(),
        dev: None,
    };
    let module = s.kernel_module()?;
    let mut gpus = s.gpus()?;
    let (mut devices, odd_nodes) = s.device_nodes()?;
    for gpu in &mut gpus {
        for node in s.dri_nodes(gpu)? {
            gpu.dri.push(node.path.to_string());
            devices.push(node);
        }
        let path = format!("/dev/nvidia{}", gpu.minor);
        if devices
            .iter()
            .any(|d| d.role == DeviceRole::Gpu && d.path == path)
        {
            gpu.device = Some(path);
        }
    }
    devices.sort();
    let kvm = s.kvm()?;
    let (host_devices, disks) = s.host_devices()?;

    let present = !devices.is_empty() || odd_nodes || !gpus.is_empty();
    match &module {
        Module::Absent if present => s.reason(format!(
            "device nodes present but the nvidia kernel module is not loaded ({VERSION_FILE} missing)"
        )),
        Module::Loaded(_) if present => s.check_nodes(&mut devices, &gpus)?,
        _ => {}
    }
    let kernel_version = match &module {
        Module::Loaded(v) => Some(v.as_str()),
        _ => None,
    };
    let driver = s.userspace(kernel_version)?;

    let verdict = if !present {
        if !s.reasons.is_empty() {
            tracing::debug!(reasons = ?s.reasons, "no NVIDIA device nodes; ignoring");
        }
        Verdict::None
    } else if s.reasons.is_empty() {
        Verdict::Complete
    } else {
        let mut seen = BTreeSet::new();
        let reasons = s
            .reasons
            .into_iter()
            .filter(|r| seen.insert(r.clone()))
            .collect();
        Verdict::Incomplete { reasons }
    };
    Ok(Inventory {
        devices,
        kvm,
        host_devices,
        disks,
        gpus,
        kernel_module: kernel_version.map(str::to_owned),
        driver,
        verdict,
    })
}

/// `p` as a [`HostPath`], or a bad-input error (exit 2) naming it: a discovered name that a
/// `.nspawn` file cannot carry (a newline in a device name would inject a line of its own) stops
/// the run before anything is rendered.
pub(super) fn checked(what: &str, p: String) -> Result<HostPath> {
    HostPath::try_from(p).map_err(|e| crate::error::bad_input(format!("{what} {e}")))
}

/// Refuse a host with more NVIDIA device nodes than any driver makes (a hard error, exit 1):
/// binding them all would write megabytes of `.nspawn` file and CDI spec.
fn too_many_nodes(count: usize, dir: &str) -> Result<()> {
    if count > MAX_DEVICE_NODES {
        bail!(
            "{dir} holds more than {MAX_DEVICE_NODES} NVIDIA device nodes, which no driver creates; refusing to bind them"
        );
    }
    Ok(())
}

enum Module {
    /// No `/proc/driver/nvidia/version`.
    Absent,
    Loaded(String),
    /// The file is there but says nothing we understand (a reason was recorded).
    Unreadable,
}

pub(super) struct Scan<'a> {
    host: &'a HostRoot,
    reasons: Vec<String>,
    /// Library dirs listed while looking for libcuda, kept for the driver-file pass: listing a
    /// big directory is the costliest step of discovery, and once is enough.
    listings: BTreeMap<String, Vec<(String, FileKind)>>,
    /// The host's `/dev`, listed once: the NVIDIA nodes and the host devices are both found
    /// there, and a host with hundreds of disks has hundreds of entries.
    dev: Option<std::rc::Rc<Vec<(String, FileKind)>>>,
}

impl Scan<'_> {
    fn reason(&mut self, r: String) {
        tracing::debug!(reason = %r, "NVIDIA state problem");
        self.reasons.push(r);
    }

    fn kernel_module(&mut self) -> Result<Module> {
        let Some(bytes) = self.read(VERSION_FILE, MAX_PROC_FILE)? else {
            return Ok(Module::Absent);
        };
        match parse::nvidia_version(&bytes) {
            Ok(k) => Ok(Module::Loaded(k.version)),
            Err(e) => {
                self.reason(format!("{VERSION_FILE}: {e}"));
                Ok(Module::Unreadable)
            }
        }
    }

    /// GPUs from /proc/driver/nvidia/gpus, cross-checked against the PCI vendor in sysfs,
    /// indexed in PCI bus order.
    fn gpus(&mut self) -> Result<Vec<Gpu>> {
        let mut found = Vec::new();
        for name in self.list(GPUS_DIR)?.unwrap_or_default() {
            let Some(addr) = PciAddress::parse(&name) else {
                self.reason(format!("{GPUS_DIR}/{name}: not a PCI address"));
                continue;
            };
            let info_path = format!("{GPUS_DIR}/{name}/information");
            let info = match self.read(&info_path, MAX_PROC_FILE)? {
                None => {
                    self.reason(format!("{info_path} missing"));
                    continue;
                }
                Some(bytes) => match parse::gpu_information(&bytes) {
                    Ok(info) => info,
                    Err(e) => {
                        self.reason(format!("{info_path}: {e}"));
                        continue;
                    }
                },
            };
            if PciAddress::parse(&info.bus_location) != Some(addr) {
                self.reason(format!(
                    "{info_path}: Bus Location {:?} does not match the directory name",
                    info.bus_location
                ));
            }
            let vendor_path = format!("{PCI_DIR}/{name}/vendor");
            match self.read(&vendor_path, MAX_PROC_FILE)? {
                None => self.reason(format!(
                    "{vendor_path} missing: cannot confirm GPU {name} is an NVIDIA PCI device"
                )),
                Some(bytes) => match parse::pci_id(&bytes) {
                    Ok(parse::NVIDIA_VENDOR) => {}
                    Ok(v) => self.reason(format!(
                        "{vendor_path} is 0x{v:04x}, not NVIDIA's 0x10de, for GPU {name}"
                    )),
                    Err(e) => self.reason(format!("{vendor_path}: {e}")),
                },
            }
            found.push((addr, name, info));
        }
        found.sort_by_key(|(addr, ..)| *addr);
        let mut minors = BTreeMap::new();
        let mut gpus = Vec::new();
        for (index, (_, bus, info)) in found.into_iter().enumerate() {
            if let Some(other) = minors.insert(info.device_minor, bus.clone()) {
                self.reason(format!(
                    "GPUs {other} and {bus} both claim Device Minor {}",
                    info.device_minor
                ));
            }
            let mig_caps = self.mig_caps(info.device_minor)?;
            gpus.push(Gpu {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                minor: info.device_minor,
                uuid: info.uuid,
                bus_id: bus,
                model: info.model,
                device: None,
                dri: Vec::new(),
                mig_caps,
            });
        }
        Ok(gpus)
    }

    /// Minors of the `/dev/nvidia-caps/nvidia-cap<N>` nodes of one GPU's MIG instances: the
    /// `DeviceFileMinor` of each `gi*/access` and `gi*/ci*/access` under
    /// `/proc/driver/nvidia/capabilities/gpu<minor>/mig`, sorted.
    fn mig_caps(&mut self, gpu_minor: u32) -> Result<Vec<u32>> {
        let base = format!("{CAPS_DIR}/gpu{gpu_minor}/mig");
        let mut files = Vec::new();
        for gi in self.list(&base)?.unwrap_or_default() {
            if !gi.starts_with("gi") {
                continue;
            }
            files.push(format!("{base}/{gi}/access"));
            for ci in self.list(&format!("{base}/{gi}"))?.unwrap_or_default() {
                if ci.starts_with("ci") {
                    files.push(format!("{base}/{gi}/{ci}/access"));
                }
            }
        }
        let mut minors = Vec::new();
        for f in files {
            let Some(bytes) = self.read(&f, MAX_PROC_FILE)? else {
                continue;
            };
            match parse::device_file_minor(&bytes) {
                Ok(m) => minors.push(m),
                Err(e) => self.reason(format!("{f}: {e}")),
            }
        }
        minors.sort_unstable();
        minors.dedup();
        Ok(minors)
    }

    /// The NVIDIA character devices under /dev (without DRI nodes), sorted by path, and whether
    /// an NVIDIA device path exists that is not a character device.
    fn device_nodes(&mut self) -> Result<(Vec<DeviceNode>, bool)> {
        let mut nodes = Vec::new();
        let mut odd = false;
        let mut candidates = Vec::new();
        for (name, _) in self.dev_entries()?.iter() {
            let role = match name.as_str() {
                "nvidiactl" => DeviceRole::Control,
                "nvidia-uvm" => DeviceRole::Uvm,
                "nvidia-uvm-tools" => DeviceRole::UvmTools,
                "nvidia-modeset" => DeviceRole::Modeset,
                n if n
                    .strip_prefix("nvidia")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())) =>
                {
                    DeviceRole::Gpu
                }
                // nvidia-nvswitch*, nvidia-nvlink, nvidia-fs, nvidia-vgpu*: host daemons' business.
                _ => continue,
            };
            candidates.push((format!("/dev/{name}"), role));
            too_many_nodes(candidates.len(), "/dev")?;
        }
        for (dir, role) in [
            ("/dev/nvidia-caps", DeviceRole::Cap),
            ("/dev/nvidia-caps-imex-channels", DeviceRole::ImexChannel),
        ] {
            match self.lstat(dir)? {
                None => {}
                Some(m) if m.is_dir() => nodes.extend(self.bound_dir_nodes(dir, role)?),
                Some(_) => {
                    odd = true;
                    self.reason(format!("{dir} exists but is not a directory"));
                }
            }
        }
        for (path, role) in candidates {
            let path = checked("device node", path)?;
            match self.char_device(&path)? {
                Some((major, minor)) => nodes.push(DeviceNode {
                    path,
                    major,
                    minor,
                    role,
                }),
                None => odd = true,
            }
        }
        Ok((nodes, odd))
    }

    /// The character devices of a directory every machine with all GPUs has bound whole and
    /// writable (the host and the machines' MIG managers and DRA driver make nodes there while
    /// they run): whatever else a machine leaves there (files, links, names a `.nspawn` line
    /// cannot carry, more nodes than any driver makes) is skipped with one warning, never a
    /// refusal that would stop every machine's start.
    fn bound_dir_nodes(&mut self, dir: &str, role: DeviceRole) -> Result<Vec<DeviceNode>> {
        let mut out = Vec::new();
        let mut junk = 0usize;
        // The listing's types (d_type) leave out a machine's files and links without a stat
        // each; a character device is stat'ed for its numbers.
        let mut entries = self.list_typed(dir)?.unwrap_or_default();
        entries.sort();
        for (name, kind) in entries {
            let path = match HostPath::try_from(format!("{dir}/{name}")) {
                Ok(p) if kind == FileKind::CharDevice => p,
                _ => {
                    junk += 1;
                    continue;
                }
            };
            match self.lstat(&path)? {
                Some(m) if m.file_type().is_char_device() => {
                    if out.len() == MAX_DEVICE_NODES {
                        tracing::warn!(
                            "{dir} holds more than {MAX_DEVICE_NODES} device nodes, which no driver makes; taking the first {MAX_DEVICE_NODES}"
                        );
                        break;
                    }
                    out.push(DeviceNode {
                        path,
                        major: nix::sys::stat::major(m.rdev()) as u32,
                        minor: nix::sys::stat::minor(m.rdev()) as u32,
                        role,
                    });
                }
                Some(_) => junk += 1,
                None => {}
            }
        }
        if junk > 0 {
            tracing::warn!(
                "{dir}: skipping {junk} entries that are not character devices a .nspawn file can bind (left by a machine?)"
            );
        }
        Ok(out)
    }

    /// `path`'s major:minor when it is a character device (lstat: a symlink is not one);
    /// records a reason when something else is there.
    fn char_device(&mut self, path: &str) -> Result<Option<(u32, u32)>> {
        match self.lstat(path)? {
            Some(m) if m.file_type().is_char_device() => {
                let rdev = m.rdev();
                Ok(Some((
                    nix::sys::stat::major(rdev) as u32,
                    nix::sys::stat::minor(rdev) as u32,
                )))
            }
            Some(m) => {
                let what = if m.file_type().is_symlink() {
                    "a symlink"
                } else {
                    "something else"
                };
                self.reason(format!("{path} is {what}, not a character device"));
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// The GPU's `/dev/dri` nodes, from `/sys/bus/pci/devices/<bus>/drm/`. Only for a device
    /// whose PCI vendor is NVIDIA's, so an integrated Intel or AMD GPU is never bound.
    fn dri_nodes(&mut self, gpu: &Gpu) -> Result<Vec<DeviceNode>> {
        let vendor = self
            .read(&format!("{PCI_DIR}/{}/vendor", gpu.bus_id), MAX_PROC_FILE)?
            .and_then(|b| parse::pci_id(&b).ok());
        if vendor != Some(parse::NVIDIA_VENDOR) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let drm = format!("{PCI_DIR}/{}/drm", gpu.bus_id);
        for name in self.list(&drm)?.unwrap_or_default() {
            if !(name.starts_with("card") || name.starts_with("renderD")) {
                continue;
            }
            let path = checked("device node", format!("/dev/dri/{name}"))?;
            match self.char_device(&path)? {
                Some((major, minor)) => out.push(DeviceNode {
                    path,
                    major,
                    minor,
                    role: DeviceRole::Dri,
                }),
                None => tracing::warn!(
                    gpu = %gpu.bus_id,
                    "{drm}/{name} has no character device {path}; not binding it"
                ),
            }
        }
        Ok(out)
    }

    fn kvm(&mut self) -> Result<Option<DeviceNode>> {
        const KVM: &str = "/dev/kvm";
        Ok(match self.lstat(KVM)? {
            Some(m) if m.file_type().is_char_device() => Some(DeviceNode {
                path: checked("device node", KVM.to_owned())?,
                major: nix::sys::stat::major(m.rdev()) as u32,
                minor: nix::sys::stat::minor(m.rdev()) as u32,
                role: DeviceRole::Kvm,
            }),
            Some(_) => {
                tracing::warn!("{KVM} is not a character device; not binding it");
                None
            }
            None => None,
        })
    }

    /// With the module loaded: every GPU has its node, the control node exists, and every node's
    /// major belongs to the running driver (`DeviceAllow=char-nvidia*`/`char-drm` resolve majors
    /// through /proc/devices, so a stale node from an earlier load would be unusable anyway).
    fn check_nodes(&mut self, devices: &mut Vec<DeviceNode>, gpus: &[Gpu]) -> Result<()> {
        for g in gpus {
            if g.device.is_none() {
                self.reason(format!(
                    "/dev/nvidia{} missing for GPU {} ({})",
                    g.minor, g.index, g.bus_id
                ));
            }
        }
        if !gpus.is_empty() && !devices.iter().any(|d| d.role == DeviceRole::Control) {
            self.reason("/dev/nvidiactl missing".to_owned());
        }
        if devices.is_empty() {
            return Ok(());
        }
        const PROC_DEVICES: &str = "/proc/devices";
        let table = match self.read(PROC_DEVICES, MAX_PROC_FILE)? {
            None => {
                self.reason(format!(
                    "{PROC_DEVICES} missing: cannot tell whether the device nodes belong to the loaded driver"
                ));
                return Ok(());
            }
            Some(bytes) => match parse::proc_devices(&bytes) {
                Ok(t) => t,
                Err(e) => {
                    self.reason(format!("{PROC_DEVICES}: {e}"));
                    return Ok(());
                }
            },
        };
        let mut foreign = 0usize;
        let mut reasons = Vec::new();
        devices.retain(|d| {
            let (group, matches): (&str, fn(&str) -> bool) = match d.role {
                DeviceRole::Dri => ("drm", |n| n == "drm"),
                _ => ("nvidia*", |n| n.starts_with("nvidia")),
            };
            if table.iter().any(|(m, n)| *m == d.major && matches(n)) {
                return true;
            }
            // A directory machines write into: another driver's node there is a machine's junk.
            if matches!(d.role, DeviceRole::Cap | DeviceRole::ImexChannel) {
                foreign += 1;
                return false;
            }
            reasons.push(format!(
                "{} is {}:{} but {PROC_DEVICES} has no {group} driver with major {} (a node left from an earlier driver?)",
                d.path, d.major, d.minor, d.major
            ));
            true
        });
        if foreign > 0 {
            tracing::warn!(
                "skipping {foreign} nodes in the NVIDIA capability and IMEX channel directories whose major is no NVIDIA driver's (left by a machine?)"
            );
        }
        for r in reasons {
            self.reason(r);
        }
        Ok(())
    }

    fn elf(&self, abs: &str) -> Result<Result<parse::ElfInfo, parse::ParseError>> {
        let f = self
            .host
            .open_read(abs)
            .with_context(|| format!("opening {}", self.host.path(abs).display()))?;
        Ok(parse::elf_info(&f))
    }

    /// [`parse::elf_deps`] of the host file `abs` (resolved inside the host root).
    pub(super) fn elf_deps(&self, abs: &str) -> Result<Result<parse::ElfDeps, parse::ParseError>> {
        let f = self
            .host
            .open_read(abs)
            .with_context(|| format!("opening {}", self.host.path(abs).display()))?;
        Ok(parse::elf_deps(&f))
    }

    // -- host tree access ----------------------------------------------------------------

    /// Read a whole small file, `None` when it does not exist; more than `limit` bytes, or
    /// something that is not a regular file, is an error.
    fn read(&self, abs: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        let p = self.host.path(abs);
        // Non-blocking: opening a FIFO for reading would otherwise wait for a writer forever.
        let f = match self.host.open_read(abs) {
            Ok(f) => f,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                return Ok(None);
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", p.display())),
        };
        let meta = f
            .metadata()
            .with_context(|| format!("stat {}", p.display()))?;
        if !meta.is_file() {
            bail!(
                "refusing to read {}: not a regular file (a FIFO or device would never end or never start)",
                p.display()
            );
        }
        let mut buf = Vec::new();
        f.take(limit + 1)
            .read_to_end(&mut buf)
            .with_context(|| format!("reading {}", p.display()))?;
        if buf.len() as u64 > limit {
            bail!(
                "refusing to read {}: larger than {} bytes, which no driver or kernel file is",
                p.display(),
                limit
            );
        }
        Ok(Some(buf))
    }

    /// The host's `/dev`, sorted by name, each entry with its type (none when it does not
    /// exist), listed once.
    pub(super) fn dev_entries(&mut self) -> Result<std::rc::Rc<Vec<(String, FileKind)>>> {
        if let Some(d) = &self.dev {
            return Ok(d.clone());
        }
        let mut entries = self.list_typed("/dev")?.unwrap_or_default();
        entries.sort();
        let d = std::rc::Rc::new(entries);
        self.dev = Some(d.clone());
        Ok(d)
    }

    /// Sorted UTF-8 entry names of a directory, `None` when it does not exist.
    fn list(&self, abs: &str) -> Result<Option<Vec<String>>> {
        Ok(self.list_typed(abs)?.map(|entries| {
            let mut names: Vec<String> = entries.into_iter().map(|(n, _)| n).collect();
            names.sort();
            names
        }))
    }

    /// Like [`Self::list`] but in directory order (callers sort what they keep: sorting a whole
    /// library dir costs more than the rest of its scan), with each entry's type as the
    /// directory reports it (`d_type`, or an `lstat` of that entry where the filesystem does
    /// not say). Never follows a symlink.
    fn list_typed(&self, abs: &str) -> Result<Option<Vec<(String, FileKind)>>> {
        let rd = match self.host.read_dir(abs) {
            Ok(rd) => rd,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                return Ok(None);
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("listing {}", self.host.path(abs).display()));
            }
        };
        let mut entries = Vec::new();
        for (name, kind) in rd {
            match name.into_string() {
                Ok(n) => entries.push((n, kind)),
                Err(n) => tracing::debug!("skipping non-UTF-8 name {n:?} in {abs}"),
            }
        }
        Ok(Some(entries))
    }

    fn lstat(&self, abs: &str) -> Result<Option<Metadata>> {
        match self.host.symlink_metadata(abs) {
            Ok(m) => Ok(Some(m)),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                Ok(None)
            }
            Err(e) => Err(e).with_context(|| format!("stat {}", self.host.path(abs).display())),
        }
    }

    /// Resolve `abs` inside the host root, following symlinks the way the host would see them
    /// (absolute targets start again at the host root, `..` stops at it). Returns the canonical
    /// host path and the metadata of what it names; `None` when it does not exist, loops, or a
    /// link target is not UTF-8. Keeps `--host-root` trees from resolving into the real `/`, and
    /// lets `/lib/x86_64-linux-gnu` and `/usr/lib/x86_64-linux-gnu` count once on merged /usr.
    pub(super) fn resolve(&self, abs: &str) -> Result<Option<(String, Metadata)>> {
        let mut todo: Vec<String> = abs
            .split('/')
            .rev()
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        let mut done: Vec<String> = Vec::new();
        let mut hops = 0;
        let mut last = None;
        while let Some(c) = todo.pop() {
            match c.as_str() {
                "." => continue,
                ".." => {
                    done.pop();
                    last = None;
                    continue;
                }
                _ => {}
            }
            let mut candidate = String::new();
            for part in done.iter().chain(std::iter::once(&c)) {
                candidate.push('/');
                candidate.push_str(part);
            }
            // Deeper than the kernel takes in one name (links can lead there): nothing at such a
            // path can be bound into a machine, and lstat would fail with ENAMETOOLONG.
            if self.host.path(&candidate).as_os_str().len() >= PATH_MAX {
                tracing::debug!("{abs} leads deeper than PATH_MAX; skipping");
                return Ok(None);
            }
            let Some(m) = self.lstat(&candidate)? else {
                return Ok(None);
            };
            if m.file_type().is_symlink() {
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return Ok(None);
                }
                let target = self.host.read_link(&candidate).with_context(|| {
                    format!("readlink {}", self.host.path(&candidate).display())
                })?;
                let Some(t) = target.to_str() else {
                    tracing::debug!("{candidate} points at a non-UTF-8 name; skipping");
                    return Ok(None);
                };
                if t.starts_with('/') {
                    done.clear();
                }
                todo.extend(
                    t.split('/')
                        .rev()
                        .filter(|c| !c.is_empty())
                        .map(str::to_owned),
                );
                last = None;
                continue;
            }
            if !todo.is_empty() && !m.is_dir() {
                return Ok(None);
            }
            done.push(c);
            last = Some(m);
        }
        let path = format!("/{}", done.join("/"));
        let meta = match last {
            Some(m) => m,
            None => match self.lstat(&path)? {
                Some(m) => m,
                None => return Ok(None),
            },
        };
        Ok(Some((path, meta)))
    }
}

mod disks;
mod driver;
mod host_devices;

#[cfg(test)]
mod tests;
