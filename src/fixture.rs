//! Host trees described in text and built at test (or demo) time, with real character devices.
//!
//! # Format
//!
//! One directive per line. A line starting with `#` is a comment and blank lines are ignored; the
//! first comment line is the host's one-line description (shown by `demo --list`). Paths are
//! absolute host paths without `.`/`..` components. Nothing is ever written *through* a symlink, so
//! a fixture cannot write outside its root whatever its links point at; every path is made once.
//!
//! ```text
//! dir  PATH                           directory (parents are created as needed)
//! file PATH [TEXT]                    regular file; TEXT is the rest of the line, with the escapes
//!                                     \n \t \\ \xHH (so non-UTF-8 bytes can be written)
//! file PATH <<TAG                     regular file holding the following lines up to a line TAG,
//!                                     each ending in a newline
//! exe  PATH                           executable stand-in (a small shell script, mode 0755)
//! chr  PATH MAJOR:MINOR [MODE]        character device via mknod (MODE octal, default 0666)
//! blk  PATH MAJOR:MINOR [MODE]        block device via mknod (MODE octal, default 0660)
//! blockdev NAME MAJOR:MINOR [DISK]    a disk or partition as the kernel shows it: its sysfs
//!                                     directory under /sys/devices (with DISK, a partition in
//!                                     that disk's), linked from /sys/class/block/NAME and
//!                                     (a disk) /sys/block/NAME,
//!                                     its /proc/partitions line, and the block device
//!                                     /dev/NAME (a `!` of NAME is a `/` there, as in sysfs)
//! sock PATH                           unix socket file (as a daemon's listening socket leaves it)
//! link PATH TARGET                    symbolic link; TARGET is verbatim (use relative targets)
//! elf  PATH ARCH [SONAME]             minimal ELF shared object with DT_SONAME;
//!                                     ARCH is x86_64, aarch64 or i386
//! nvidia-libs DIR VERSION ARCH [-NAME...]
//!                                     the userspace driver's libraries: DIR/<name>.so.VERSION as
//!                                     ELF stand-ins with their real SONAMEs, the SONAME links,
//!                                     vdpau/, the libcuda.so link and an EGL platform library
//!                                     whose version is its own; -NAME leaves NAME out
//! ldcache DIR[=ALIAS]...              /etc/ld.so.cache (glibc-ld.so.cache1.1) listing the SONAME of
//!                                     every ELF made so far in the DIRs, as ldconfig would; with
//!                                     =ALIAS the entries name ALIAS instead (Debian's merged /usr
//!                                     lists /lib/x86_64-linux-gnu for /usr/lib/x86_64-linux-gnu)
//! nvidia-kernel VERSION ARCH [open]   /proc/driver/nvidia/version, proprietary or open wording
//! nvidia-gpu BUS MINOR UUID MODEL...  /proc/driver/nvidia/gpus/BUS/information, and the PCI
//!                                     device /sys/bus/pci/devices/BUS with vendor 0x10de
//! pci  BUS VENDOR                     /sys/bus/pci/devices/BUS/vendor for any other PCI device
//! drm  BUS NAME...                    /sys/bus/pci/devices/BUS/drm/NAME (card0, renderD128, ...)
//! ```
//!
//! Device nodes need root (mknod); everything else does not.

use anyhow::{Context as _, Result, bail};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// The example hosts shipped with the binary: (name, description text).
pub const EXAMPLES: &[(&str, &str)] = &[
    ("cpu-only", include_str!("../assets/hosts/cpu-only.host")),
    ("kvm-only", include_str!("../assets/hosts/kvm-only.host")),
    ("one-gpu", include_str!("../assets/hosts/one-gpu.host")),
    ("two-gpus", include_str!("../assets/hosts/two-gpus.host")),
    (
        "eight-gpus",
        include_str!("../assets/hosts/eight-gpus.host"),
    ),
    (
        "foreign-drm",
        include_str!("../assets/hosts/foreign-drm.host"),
    ),
    (
        "libs-without-module",
        include_str!("../assets/hosts/libs-without-module.host"),
    ),
    (
        "version-mismatch",
        include_str!("../assets/hosts/version-mismatch.host"),
    ),
    (
        "nodes-without-libs",
        include_str!("../assets/hosts/nodes-without-libs.host"),
    ),
    ("aarch64", include_str!("../assets/hosts/aarch64.host")),
    ("gb300", include_str!("../assets/hosts/gb300.host")),
    (
        "ldcache-only",
        include_str!("../assets/hosts/ldcache-only.host"),
    ),
];

/// The text of an embedded example host.
pub fn example(name: &str) -> Option<&'static str> {
    EXAMPLES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// A host description's one-line summary: its first comment line.
pub fn description(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.strip_prefix('#'))
        .map_or("", str::trim)
}

/// CPU architectures a fixture can build libraries for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
    I386,
}

impl Arch {
    pub(crate) fn parse(s: &str) -> Result<Arch> {
        Ok(match s {
            "x86_64" => Arch::X86_64,
            "aarch64" => Arch::Aarch64,
            "i386" => Arch::I386,
            other => bail!("unknown architecture {other:?} (x86_64, aarch64, i386)"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
            Arch::I386 => "i386",
        }
    }

    /// glibc's ld.so.cache flags for a libc6 library of this architecture.
    fn ldcache_flags(self) -> u32 {
        match self {
            Arch::X86_64 => 0x0303,
            Arch::Aarch64 => 0x0a03,
            Arch::I386 => 0x0003,
        }
    }
}

/// The smallest ELF shared object that tools accept as one: an ELF header, a `PT_LOAD` covering
/// the file, a `PT_DYNAMIC` with `DT_STRTAB`/`DT_STRSZ`/`DT_SONAME`, and the string table.
/// ELF64 little-endian for x86_64 and aarch64, ELF32 for i386.
pub fn elf_shared_object(arch: Arch, soname: Option<&str>) -> Vec<u8> {
    let (bits64, machine) = match arch {
        Arch::X86_64 => (true, 62u16),
        Arch::Aarch64 => (true, 183),
        Arch::I386 => (false, 3),
    };
    let (ehsize, phentsize, dynent) = if bits64 { (64, 56, 16) } else { (52, 32, 8) };
    let phnum = 2;
    let strtab_off = ehsize + phentsize * phnum;
    let mut strtab = vec![0u8];
    if let Some(s) = soname {
        strtab.extend_from_slice(s.as_bytes());
        strtab.push(0);
    }
    let dyn_off = (strtab_off + strtab.len()).next_multiple_of(8);
    let mut dyns: Vec<(u64, u64)> = vec![(5, strtab_off as u64), (10, strtab.len() as u64)];
    if soname.is_some() {
        dyns.push((14, 1));
    }
    dyns.push((0, 0));
    let dyn_size = dyns.len() * dynent;
    let total = dyn_off + dyn_size;

    let mut out = Vec::with_capacity(total);
    let w16 = |o: &mut Vec<u8>, v: u16| o.extend_from_slice(&v.to_le_bytes());
    let w32 = |o: &mut Vec<u8>, v: u32| o.extend_from_slice(&v.to_le_bytes());
    // A native-word field: 8 bytes in ELF64, 4 in ELF32.
    let wn = |o: &mut Vec<u8>, v: u64| {
        if bits64 {
            o.extend_from_slice(&v.to_le_bytes())
        } else {
            o.extend_from_slice(&(v as u32).to_le_bytes())
        }
    };
    out.extend_from_slice(b"\x7fELF");
    out.extend_from_slice(&[if bits64 { 2 } else { 1 }, 1, 1, 0]);
    out.extend_from_slice(&[0; 8]);
    w16(&mut out, 3); // ET_DYN
    w16(&mut out, machine);
    w32(&mut out, 1); // EV_CURRENT
    wn(&mut out, 0); // e_entry
    wn(&mut out, ehsize as u64); // e_phoff
    wn(&mut out, 0); // e_shoff
    w32(&mut out, 0); // e_flags
    w16(&mut out, ehsize as u16);
    w16(&mut out, phentsize as u16);
    w16(&mut out, phnum as u16);
    w16(&mut out, if bits64 { 64 } else { 40 }); // e_shentsize
    w16(&mut out, 0); // e_shnum
    w16(&mut out, 0); // e_shstrndx
    // (type, flags, offset/vaddr, size, align)
    let phdrs = [
        (1u32, 4u32, 0u64, total as u64, 0x1000u64),
        (2, 6, dyn_off as u64, dyn_size as u64, 8),
    ];
    for (kind, flags, off, size, align) in phdrs {
        w32(&mut out, kind);
        if bits64 {
            w32(&mut out, flags);
        }
        wn(&mut out, off); // p_offset
        wn(&mut out, off); // p_vaddr
        wn(&mut out, off); // p_paddr
        wn(&mut out, size); // p_filesz
        wn(&mut out, size); // p_memsz
        if !bits64 {
            w32(&mut out, flags);
        }
        wn(&mut out, align);
    }
    out.extend_from_slice(&strtab);
    out.resize(dyn_off, 0);
    for (tag, val) in dyns {
        wn(&mut out, tag);
        wn(&mut out, val);
    }
    out
}

/// A glibc `ld.so.cache` in the `glibc-ld.so.cache1.1` format holding `(key, path, flags)` entries
/// in the given order, written by the product's own writer ([`crate::discovery::ldcache::render`]). (glibc's
/// own lookup binary-searches ldconfig's sort order; our reader does not care, and ldconfig -p
/// prints any order.)
pub fn ld_so_cache(entries: &[(&str, &str, u32)]) -> Vec<u8> {
    let entries: Vec<crate::discovery::ldcache::Entry> = entries
        .iter()
        .map(|&(key, path, flags)| crate::discovery::ldcache::Entry::new(flags as i32, key, path))
        .collect();
    crate::discovery::ldcache::render(&entries)
}

/// The driver's libraries as `nvidia-libs` lays them out: (name without `.so.<version>`, SONAME
/// suffix after `.so.`, where `None` means the SONAME is the versioned file name itself).
const DRIVER_LIBS: &[(&str, Option<&str>)] = &[
    ("libcuda", Some("1")),
    ("libcudadebugger", Some("1")),
    ("libnvidia-ml", Some("1")),
    ("libnvidia-ptxjitcompiler", Some("1")),
    ("libnvidia-nvvm", Some("4")),
    ("libnvidia-cfg", Some("1")),
    ("libnvidia-gpucomp", None),
    ("libnvidia-allocator", Some("1")),
    ("libnvidia-opencl", Some("1")),
    ("libnvidia-encode", Some("1")),
    ("libnvcuvid", Some("1")),
    ("libnvidia-opticalflow", Some("1")),
    ("libEGL_nvidia", Some("0")),
    ("libGLX_nvidia", Some("0")),
    ("libGLESv2_nvidia", Some("2")),
    ("libGLESv1_CM_nvidia", Some("1")),
    ("libnvidia-eglcore", None),
    ("libnvidia-glcore", None),
    ("libnvidia-glsi", None),
    ("libnvidia-tls", None),
    ("libnvidia-rtcore", None),
    ("libnvoptix", Some("1")),
    ("vdpau/libvdpau_nvidia", Some("1")),
];

#[derive(Debug)]
enum Op {
    Dir(String),
    File(String, Vec<u8>),
    Exe(String),
    Chr(String, u32, u32, u32),
    Blk(String, u32, u32, u32),
    BlockDev(String, u32, u32, Option<String>),
    Sock(String),
    Link(String, String),
    Elf(String, Arch, Option<String>),
    NvidiaLibs(String, String, Arch, Vec<String>),
    LdCache(Vec<(String, String)>),
    NvidiaKernel(String, Arch, bool),
    NvidiaGpu(String, u32, String, String),
    Pci(String, String),
    Drm(String, Vec<String>),
}

/// Parse a host description into operations, with line numbers for errors.
fn parse(text: &str) -> Result<Vec<(usize, Op)>> {
    let mut ops = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, raw)) = lines.next() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let op = parse_line(line, &mut lines)
            .with_context(|| format!("host description line {n}: {line:?}"))?;
        ops.push((n, op));
    }
    Ok(ops)
}

// Long on purpose: one match arm per directive of the format in the module doc, in its order, so
// the parser reads against that table; splitting it would scatter one grammar over many places.
fn parse_line<'a>(line: &str, more: &mut impl Iterator<Item = (usize, &'a str)>) -> Result<Op> {
    let (verb, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim_start();
    let words: Vec<&str> = rest.split_whitespace().collect();
    let path = |i: usize| -> Result<String> {
        let p = words.get(i).context("missing path")?;
        check_path(p)?;
        Ok((*p).to_owned())
    };
    let argc = |min: usize, max: usize| -> Result<()> {
        if words.len() < min || words.len() > max {
            bail!("{verb} takes {min}..={max} arguments, got {}", words.len());
        }
        Ok(())
    };
    Ok(match verb {
        "dir" => {
            argc(1, 1)?;
            Op::Dir(path(0)?)
        }
        "file" => {
            let p = path(0)?;
            let text = rest
                .split_once(char::is_whitespace)
                .map_or("", |(_, t)| t.trim_start());
            if let Some(tag) = text.strip_prefix("<<") {
                let tag = tag.trim();
                if tag.is_empty() {
                    bail!("heredoc needs a tag: file PATH <<TAG");
                }
                let mut body = Vec::new();
                loop {
                    let (_, l) = more.next().with_context(|| format!("no closing {tag}"))?;
                    if l.trim() == tag {
                        break;
                    }
                    body.extend_from_slice(l.as_bytes());
                    body.push(b'\n');
                }
                Op::File(p, body)
            } else {
                Op::File(p, unescape(text)?)
            }
        }
        "exe" => {
            argc(1, 1)?;
            Op::Exe(path(0)?)
        }
        "chr" => {
            argc(2, 3)?;
            let (maj, min) = words[1].split_once(':').context("expected MAJOR:MINOR")?;
            let mode = match words.get(2) {
                Some(m) => u32::from_str_radix(m, 8).with_context(|| format!("bad mode {m}"))?,
                None => 0o666,
            };
            Op::Chr(path(0)?, maj.parse()?, min.parse()?, mode)
        }
        "blk" => {
            argc(2, 3)?;
            let (maj, min) = words[1].split_once(':').context("expected MAJOR:MINOR")?;
            let mode = match words.get(2) {
                Some(m) => u32::from_str_radix(m, 8).with_context(|| format!("bad mode {m}"))?,
                None => 0o660,
            };
            Op::Blk(path(0)?, maj.parse()?, min.parse()?, mode)
        }
        "blockdev" => {
            argc(2, 3)?;
            let (maj, min) = words[1].split_once(':').context("expected MAJOR:MINOR")?;
            let (maj, min): (u32, u32) = (maj.parse()?, min.parse()?);
            for name in [Some(words[0]), words.get(2).copied()]
                .into_iter()
                .flatten()
            {
                anyhow::ensure!(
                    !name.contains('/')
                        && name
                            .split('!')
                            .all(|c| !c.is_empty() && c != "." && c != ".."),
                    "bad block device name {name}"
                );
            }
            Op::BlockDev(
                words[0].to_owned(),
                maj,
                min,
                words.get(2).map(|d| (*d).to_owned()),
            )
        }
        "sock" => {
            argc(1, 1)?;
            Op::Sock(path(0)?)
        }
        "link" => {
            argc(2, 2)?;
            Op::Link(path(0)?, words[1].to_owned())
        }
        "elf" => {
            argc(2, 3)?;
            Op::Elf(
                path(0)?,
                Arch::parse(words[1])?,
                words.get(2).map(|s| (*s).to_owned()),
            )
        }
        "nvidia-libs" => {
            if words.len() < 3 {
                bail!("nvidia-libs DIR VERSION ARCH [-NAME...]");
            }
            let mut without = Vec::new();
            for w in &words[3..] {
                let name = w
                    .strip_prefix('-')
                    .context("exclusions look like -libnvidia-ml")?;
                without.push(name.to_owned());
            }
            if !crate::discovery::parse::is_version(words[1]) {
                bail!("{:?} is not a driver version", words[1]);
            }
            Op::NvidiaLibs(
                path(0)?,
                words[1].to_owned(),
                Arch::parse(words[2])?,
                without,
            )
        }
        "ldcache" => {
            if words.is_empty() {
                bail!("ldcache DIR...");
            }
            let mut dirs = Vec::new();
            for w in &words {
                let (dir, alias) = w.split_once('=').unwrap_or((w, w));
                check_path(dir)?;
                check_path(alias)?;
                dirs.push((dir.to_owned(), alias.to_owned()));
            }
            Op::LdCache(dirs)
        }
        "nvidia-kernel" => {
            argc(2, 3)?;
            let open = match words.get(2) {
                None => false,
                Some(&"open") => true,
                Some(o) => bail!("expected \"open\", got {o:?}"),
            };
            Op::NvidiaKernel(words[0].to_owned(), Arch::parse(words[1])?, open)
        }
        "nvidia-gpu" => {
            if words.len() < 4 {
                bail!("nvidia-gpu BUS MINOR UUID MODEL...");
            }
            check_bus(words[0])?;
            let model = words[3..].join(" ");
            Op::NvidiaGpu(
                words[0].to_owned(),
                words[1].parse()?,
                words[2].to_owned(),
                model,
            )
        }
        "pci" => {
            argc(2, 2)?;
            check_bus(words[0])?;
            Op::Pci(words[0].to_owned(), words[1].to_owned())
        }
        "drm" => {
            if words.len() < 2 {
                bail!("drm BUS NAME...");
            }
            check_bus(words[0])?;
            for w in &words[1..] {
                if w.contains('/') || *w == "." || *w == ".." {
                    bail!("{w:?} is not a DRM node name");
                }
            }
            Op::Drm(
                words[0].to_owned(),
                words[1..].iter().map(|s| (*s).to_owned()).collect(),
            )
        }
        other => bail!("unknown directive {other:?}"),
    })
}

fn check_path(p: &str) -> Result<()> {
    if !p.starts_with('/') || p == "/" {
        bail!("{p:?} is not an absolute path below /");
    }
    if p.split('/').any(|c| c == "." || c == "..") || p.contains('\0') {
        bail!("{p:?} has a . or .. component");
    }
    Ok(())
}

fn check_bus(bus: &str) -> Result<()> {
    if crate::discovery::parse::PciAddress::parse(bus).is_none() {
        bail!("{bus:?} is not a PCI address like 0000:06:00.0");
    }
    Ok(())
}

fn unescape(s: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match it.next() {
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hi = it.next().context("\\x needs two hex digits")?;
                let lo = it.next().context("\\x needs two hex digits")?;
                let hex = [hi, lo];
                let hex = std::str::from_utf8(&hex).context("\\x needs two hex digits")?;
                out.push(u8::from_str_radix(hex, 16).context("\\x needs two hex digits")?);
            }
            other => bail!("unknown escape \\{}", other.map_or('?', char::from)),
        }
    }
    Ok(out)
}

/// Build the host tree described by `text` under `root` (created if missing). Needs root for
/// character devices.
pub fn materialize(text: &str, root: &Path) -> Result<()> {
    let ops = parse(text)?;
    fs_err::create_dir_all(root)?;
    let mut b = Builder {
        root: root.to_path_buf(),
        elves: Vec::new(),
        partitions: String::new(),
    };
    for (n, op) in ops {
        b.apply(op)
            .with_context(|| format!("host description line {n}"))?;
    }
    if !b.partitions.is_empty() {
        let text = format!("major minor  #blocks  name\n\n{}", b.partitions);
        b.file("/proc/partitions", text.as_bytes(), 0o444)?;
    }
    Ok(())
}

struct Builder {
    root: PathBuf,
    /// ELF objects made so far: (absolute host path, SONAME, arch), for `ldcache`.
    elves: Vec<(String, Option<String>, Arch)>,
    /// `/proc/partitions` lines of the `blockdev`s so far, written last.
    partitions: String,
}

impl Builder {
    // Long on purpose: one arm per directive, like `parse_line`; the arms that build a driver
    // (`nvidia-libs`, `ldcache`) are the format's own semantics, kept beside the others.
    fn apply(&mut self, op: Op) -> Result<()> {
        match op {
            Op::Dir(p) => self.dir(&p),
            Op::File(p, bytes) => self.file(&p, &bytes, 0o644),
            Op::Exe(p) => self.file(&p, b"#!/bin/sh\necho \"fixture stand-in for $0\"\n", 0o755),
            Op::Chr(p, maj, min, mode) => {
                self.node(&p, SFlag::S_IFCHR, makedev(maj.into(), min.into()), mode)
            }
            Op::Blk(p, maj, min, mode) => {
                self.node(&p, SFlag::S_IFBLK, makedev(maj.into(), min.into()), mode)
            }
            Op::BlockDev(name, maj, min, disk) => {
                // Where the kernel puts it: device mapper, md, loop and RAM disks under
                // virtual/, the rest under their controller; a partition in its disk's directory.
                let base = |n: &str| {
                    let virt = ["dm-", "md", "bcache", "loop", "ram", "zram"];
                    if virt.iter().any(|p| n.starts_with(p)) {
                        "devices/virtual/block"
                    } else {
                        "devices/platform/host0/block"
                    }
                };
                let dir = match &disk {
                    Some(d) => format!("{}/{d}/{name}", base(d)),
                    None => format!("{}/{name}", base(&name)),
                };
                let dev = format!("{maj}:{min}\n");
                self.file(&format!("/sys/{dir}/dev"), dev.as_bytes(), 0o444)?;
                if disk.is_some() {
                    self.file(&format!("/sys/{dir}/partition"), b"1\n", 0o444)?;
                }
                self.apply(Op::Link(
                    format!("/sys/class/block/{name}"),
                    format!("../../{dir}"),
                ))?;
                if disk.is_none() {
                    self.apply(Op::Link(format!("/sys/block/{name}"), format!("../{dir}")))?;
                }
                self.partitions.push_str(&format!(
                    "{maj:4} {min:7} {:10} {}\n",
                    1 << 20,
                    name.replace('!', "/")
                ));
                let node = format!("/dev/{}", name.replace('!', "/"));
                self.node(
                    &node,
                    SFlag::S_IFBLK,
                    makedev(maj.into(), min.into()),
                    0o660,
                )
            }
            Op::Sock(p) => self.node(&p, SFlag::S_IFSOCK, 0, 0o777),
            Op::Link(p, target) => {
                let at = self.fresh(&p)?;
                std::os::unix::fs::symlink(&target, &at)
                    .with_context(|| format!("symlink {} -> {target}", at.display()))
            }
            Op::Elf(p, arch, soname) => self.elf(&p, arch, soname.as_deref()),
            Op::NvidiaLibs(dir, version, arch, without) => {
                for (name, so) in DRIVER_LIBS {
                    let base = name.rsplit('/').next().unwrap_or(name);
                    if without.iter().any(|w| w == base) {
                        continue;
                    }
                    let file = format!("{dir}/{name}.so.{version}");
                    let soname = match so {
                        Some(s) => format!("{base}.so.{s}"),
                        None => format!("{base}.so.{version}"),
                    };
                    self.elf(&file, arch, Some(&soname))?;
                    if so.is_some() {
                        let link_dir = file.rsplit_once('/').map_or(dir.as_str(), |(d, _)| d);
                        self.apply(Op::Link(
                            format!("{link_dir}/{soname}"),
                            format!("{base}.so.{version}"),
                        ))?;
                    }
                }
                if !without.iter().any(|w| w == "libcuda") {
                    self.apply(Op::Link(format!("{dir}/libcuda.so"), "libcuda.so.1".into()))?;
                }
                // A driver file whose version suffix is its own, not the driver's.
                self.elf(
                    &format!("{dir}/libnvidia-egl-wayland.so.1.1.13"),
                    arch,
                    Some("libnvidia-egl-wayland.so.1"),
                )
            }
            Op::LdCache(dirs) => {
                let mut entries: Vec<(String, String, u32)> = self
                    .elves
                    .iter()
                    .filter_map(|(path, soname, arch)| {
                        let (dir, _) = path.rsplit_once('/')?;
                        let soname = soname.as_ref()?;
                        let (_, alias) = dirs.iter().find(|(d, _)| d == dir)?;
                        Some((
                            soname.clone(),
                            format!("{alias}/{soname}"),
                            arch.ldcache_flags(),
                        ))
                    })
                    .collect();
                // Roughly ldconfig's order (it sorts keys descending).
                entries.sort_by(|a, b| b.cmp(a));
                entries.dedup();
                let refs: Vec<(&str, &str, u32)> = entries
                    .iter()
                    .map(|(k, p, f)| (k.as_str(), p.as_str(), *f))
                    .collect();
                self.file("/etc/ld.so.cache", &ld_so_cache(&refs), 0o644)
            }
            Op::NvidiaKernel(version, arch, open) => {
                let date = "Wed Oct  1 20:32:12 UTC 2025";
                let first = if open {
                    format!(
                        "NVRM version: NVIDIA UNIX Open Kernel Module for {}  {version}  Release Build  (dvs-builder@U22-I3-AE18-23-3)  {date}",
                        arch.name()
                    )
                } else {
                    format!(
                        "NVRM version: NVIDIA UNIX {} Kernel Module  {version}  {date}",
                        arch.name()
                    )
                };
                let text = format!(
                    "{first}\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
                );
                self.file("/proc/driver/nvidia/version", text.as_bytes(), 0o444)
            }
            Op::NvidiaGpu(bus, minor, uuid, model) => {
                let mut info = String::new();
                let _ = write!(
                    info,
                    "Model: \t\t {model}\nIRQ:   \t\t {}\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.af.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Firmware: \t 580.95.05\nGPU Excluded:\t No\n",
                    100 + minor
                );
                self.file(
                    &format!("/proc/driver/nvidia/gpus/{bus}/information"),
                    info.as_bytes(),
                    0o444,
                )?;
                self.file(
                    &format!("/sys/bus/pci/devices/{bus}/vendor"),
                    b"0x10de\n",
                    0o444,
                )?;
                self.file(
                    &format!("/sys/bus/pci/devices/{bus}/class"),
                    b"0x030200\n",
                    0o444,
                )
            }
            Op::Pci(bus, vendor) => self.file(
                &format!("/sys/bus/pci/devices/{bus}/vendor"),
                format!("{vendor}\n").as_bytes(),
                0o444,
            ),
            Op::Drm(bus, names) => {
                for name in names {
                    self.dir(&format!("/sys/bus/pci/devices/{bus}/drm/{name}"))?;
                }
                Ok(())
            }
        }
    }

    fn elf(&mut self, p: &str, arch: Arch, soname: Option<&str>) -> Result<()> {
        self.file(p, &elf_shared_object(arch, soname), 0o644)?;
        self.elves
            .push((p.to_owned(), soname.map(str::to_owned), arch));
        Ok(())
    }

    /// Create the parents of `abs` (never through a symlink) and return its path under the root.
    fn parents(&self, abs: &str) -> Result<PathBuf> {
        let mut at = self.root.clone();
        let comps: Vec<&str> = abs.split('/').filter(|c| !c.is_empty()).collect();
        let Some((_, dirs)) = comps.split_last() else {
            bail!("{abs:?} has no file name");
        };
        for c in dirs {
            at.push(c);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => bail!(
                    "{} is a symlink; host descriptions never write through symlinks (write to its target's path instead)",
                    at.display()
                ),
                Ok(m) if m.is_dir() => {}
                Ok(_) => bail!("{} is not a directory", at.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    fs_err::create_dir(&at)?;
                }
                Err(e) => return Err(e).with_context(|| format!("stat {}", at.display())),
            }
        }
        Ok(self.root.join(abs.trim_start_matches('/')))
    }

    /// Like [`Self::parents`], and `abs` itself must not exist yet.
    fn fresh(&self, abs: &str) -> Result<PathBuf> {
        let at = self.parents(abs)?;
        if std::fs::symlink_metadata(&at).is_ok() {
            bail!("{abs} is described twice");
        }
        Ok(at)
    }

    fn dir(&self, abs: &str) -> Result<()> {
        let at = self.parents(abs)?;
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => bail!("{abs} exists and is not a directory"),
            Err(_) => Ok(fs_err::create_dir(&at)?),
        }
    }

    fn file(&self, abs: &str, bytes: &[u8], mode: u32) -> Result<()> {
        let at = self.fresh(abs)?;
        fs_err::write(&at, bytes)?;
        fs_err::set_permissions(&at, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    }

    fn node(&self, abs: &str, kind: SFlag, dev: u64, mode: u32) -> Result<()> {
        let at = self.fresh(abs)?;
        mknod(&at, kind, Mode::from_bits_truncate(mode), dev).with_context(|| {
            format!(
                "mknod {} (device nodes need root; the fixture hosts and demo must run as root)",
                at.display()
            )
        })?;
        // mknod honours the umask; set the mode the description asked for.
        fs_err::set_permissions(&at, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
