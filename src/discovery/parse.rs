//! Parsers for what the driver, the kernel and glibc publish; they take bytes, never paths.
//!
//! Every parser is bounded and panic-free on any input (they are fuzzed): indexing goes through
//! `get`, arithmetic is checked, loops have fixed upper bounds, and errors say what was wrong.
//! The caller names the file in its message; these errors name the line or field.

use std::fmt;
use std::io;
use std::os::unix::fs::FileExt;

/// Why bytes could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl ParseError {
    fn new(msg: impl Into<String>) -> Self {
        ParseError(msg.into())
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

type Result<T> = std::result::Result<T, ParseError>;

/// Longest driver version we accept (`580.95.05` is 9); longer is garbage, not a version.
const MAX_VERSION_LEN: usize = 32;

/// Whether `s` looks like an NVIDIA driver version: dot-separated decimal numbers, at least two
/// (`580.95.05`, `550.54`). Versions end up in file names and paths, so nothing else may pass.
pub fn is_version(s: &str) -> bool {
    s.len() <= MAX_VERSION_LEN
        && s.contains('.')
        && s.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Compare two [`is_version`] strings numerically, component by component (`580.95.05` >
/// `580.9.99`); leading zeros do not count.
pub fn cmp_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |s: &str| -> Vec<(usize, String)> {
        s.split('.')
            .map(|p| {
                let t = p.trim_start_matches('0');
                (t.len(), t.to_owned())
            })
            .collect()
    };
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

/// The first line of a /proc file as text, or an error saying why not.
fn first_line(bytes: &[u8]) -> Result<&str> {
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    if line.is_empty() {
        return Err(ParseError::new("empty first line"));
    }
    std::str::from_utf8(line).map_err(|_| ParseError::new("first line is not UTF-8"))
}

/// What `/proc/driver/nvidia/version` says about the loaded kernel module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelModule {
    pub version: String,
    /// The open GPU kernel modules (`NVIDIA UNIX Open Kernel Module for <arch>`).
    pub open: bool,
}

/// Parse the first line of `/proc/driver/nvidia/version`, in either form:
/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  <date>` (proprietary) or
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.42.06  Release Build  (…)  <date>`.
pub fn nvidia_version(bytes: &[u8]) -> Result<KernelModule> {
    let line = first_line(bytes)?;
    let rest = line.strip_prefix("NVRM version:").ok_or_else(|| {
        ParseError::new(format!(
            "first line {:?} is not \"NVRM version: …\"",
            shorten(line)
        ))
    })?;
    let (before, after) = rest.split_once("Kernel Module").ok_or_else(|| {
        ParseError::new(format!(
            "first line {:?} has no \"Kernel Module\"",
            shorten(line)
        ))
    })?;
    let open = before.split_whitespace().any(|w| w == "Open");
    let mut words = after.split_whitespace();
    // The open form puts "for <arch>" between "Kernel Module" and the version.
    let mut word = words.next();
    if word == Some("for") {
        words.next();
        word = words.next();
    }
    match word {
        Some(v) if is_version(v) => Ok(KernelModule {
            version: v.to_owned(),
            open,
        }),
        _ => Err(ParseError::new(format!(
            "no driver version after \"Kernel Module\" in {:?}",
            shorten(line)
        ))),
    }
}

/// Keep error messages about garbage short.
fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The fields we use from `/proc/driver/nvidia/gpus/<bus>/information`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInformation {
    pub model: String,
    pub uuid: String,
    pub bus_location: String,
    pub device_minor: u32,
}

/// Parse `/proc/driver/nvidia/gpus/<bus>/information` (`Key:   value` lines). `Model`, `GPU UUID`,
/// `Bus Location` and `Device Minor` are required.
pub fn gpu_information(bytes: &[u8]) -> Result<GpuInformation> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError::new("not UTF-8"))?;
    let (mut model, mut uuid, mut bus, mut minor) = (None, None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Model" => model = Some(value),
            "GPU UUID" => uuid = Some(value),
            "Bus Location" => bus = Some(value),
            "Device Minor" => minor = Some(value),
            _ => {}
        }
    }
    let need = |v: Option<&str>, key: &str| -> Result<String> {
        match v {
            // The values reach `discover`'s output on a terminal: no `\r`, escapes or NULs.
            Some(s) if s.contains(char::is_control) => Err(ParseError::new(format!(
                "{key} {:?} contains control characters",
                shorten(s)
            ))),
            Some(s) if !s.is_empty() => Ok(s.to_owned()),
            _ => Err(ParseError::new(format!("no \"{key}:\" line"))),
        }
    };
    let model = need(model, "Model")?;
    let uuid = need(uuid, "GPU UUID")?;
    if !uuid.starts_with("GPU-")
        || uuid.len() > 64
        || !uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ParseError::new(format!(
            "GPU UUID {:?} is not like GPU-edfee158-11c1-52b8-0517-92f30e7fac88",
            shorten(&uuid)
        )));
    }
    let bus_location = need(bus, "Bus Location")?;
    let minor_text = need(minor, "Device Minor")?;
    let device_minor = minor_text.parse::<u32>().map_err(|_| {
        ParseError::new(format!(
            "Device Minor {:?} is not a number",
            shorten(&minor_text)
        ))
    })?;
    Ok(GpuInformation {
        model,
        uuid,
        bus_location,
        device_minor,
    })
}

/// The `DeviceFileMinor: N` line of a `/proc/driver/nvidia/capabilities/…/access` file: the
/// minor of the `/dev/nvidia-caps/nvidia-cap<N>` node that grants the capability.
pub(crate) fn device_file_minor(bytes: &[u8]) -> Result<u32> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError::new("not UTF-8"))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("DeviceFileMinor:"))
        .ok_or_else(|| ParseError::new("no DeviceFileMinor line"))?
        .trim()
        .parse()
        .map_err(|_| ParseError::new("DeviceFileMinor is not a number"))
}

pub use crate::types::gpus::PciAddress;

/// A sysfs `dev` file (`/sys/class/misc/rdma_cm/dev`): the kernel's
/// `%u:%u\n`, major and minor.
pub(crate) fn dev_numbers(bytes: &[u8]) -> Result<(u32, u32)> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError::new("not UTF-8"))?;
    let t = text.strip_suffix('\n').unwrap_or(text);
    let number = |w: &str| {
        (!w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
            .then(|| w.parse::<u32>().ok())
            .flatten()
    };
    t.split_once(':')
        .and_then(|(a, b)| Some((number(a)?, number(b)?)))
        .ok_or_else(|| ParseError::new(format!("{:?} is not \"<major>:<minor>\"", shorten(t))))
}

/// Parse the "Character devices:" section of `/proc/devices` into (major, driver name) pairs,
/// in file order. A major may appear more than once (`4 /dev/vc/0`, `4 tty`).
pub fn proc_devices(bytes: &[u8]) -> Result<Vec<(u32, String)>> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError::new("not UTF-8"))?;
    let mut lines = text.lines();
    if !lines.any(|l| l.trim() == "Character devices:") {
        return Err(ParseError::new("no \"Character devices:\" section"));
    }
    let mut out = Vec::new();
    for line in lines {
        let line = line.trim();
        if line.is_empty() || line.ends_with("devices:") {
            break;
        }
        let mut words = line.split_whitespace();
        let (Some(major), Some(name), None) = (words.next(), words.next(), words.next()) else {
            return Err(ParseError::new(format!(
                "line {:?} is not \"<major> <name>\"",
                shorten(line)
            )));
        };
        let major = major.parse::<u32>().map_err(|_| {
            ParseError::new(format!(
                "line {:?} does not start with a major number",
                shorten(line)
            ))
        })?;
        out.push((major, name.to_owned()));
    }
    Ok(out)
}

/// Parse a PCI sysfs `vendor` (or `device`) file: `0x10de\n`.
pub fn pci_id(bytes: &[u8]) -> Result<u16> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError::new("not UTF-8"))?;
    let t = text.trim_end_matches('\n');
    // `from_str_radix` alone would also take a sign (`0x+0de`): only the kernel's `0x%04x`.
    t.strip_prefix("0x")
        .filter(|h| h.len() == 4 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u16::from_str_radix(h, 16).ok())
        .ok_or_else(|| ParseError::new(format!("{:?} is not a 16-bit id like 0x10de", shorten(t))))
}

/// The NVIDIA PCI vendor id.
pub(crate) const NVIDIA_VENDOR: u16 = 0x10de;

// ---------------------------------------------------------------------------------------------
// glibc ld.so.cache: read by [`crate::discovery::ldcache`], the one reader and writer of the format.

pub use crate::discovery::ldcache::{
    LdCacheEntry, MAX_CACHE_ENTRIES, each as ld_so_cache_each, entries as ld_so_cache,
};

use crate::types::bytes::read_u32;

// ---------------------------------------------------------------------------------------------
// ELF

/// Random access to a file's bytes, so the ELF reader touches only the few ranges it needs of a
/// 100 MB library (a `File` reads with `pread`, a slice from memory).
pub trait ReadAt {
    /// Read up to `buf.len()` bytes at `offset`; fewer only at the end of the data.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let Some(src) = usize::try_from(offset).ok().and_then(|o| self.get(o..)) else {
            return Ok(0);
        };
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        Ok(n)
    }
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let at = offset
                .checked_add(done as u64)
                .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
            match FileExt::read_at(self, &mut buf[done..], at) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
}

/// ELF machine numbers we map to Debian multiarch triplets.
pub(crate) const EM_386: u16 = 3;
pub const EM_X86_64: u16 = 62;
pub const EM_AARCH64: u16 = 183;

/// What the helper needs from an ELF shared object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    /// 32 or 64.
    pub bits: u8,
    pub big_endian: bool,
    /// `e_machine`.
    pub machine: u16,
    /// `DT_SONAME`, when the object has one.
    pub soname: Option<String>,
}

impl ElfInfo {
    /// The Debian multiarch triplet for this object, for the architectures we support.
    pub fn triplet(&self) -> Option<&'static str> {
        match (self.bits, self.big_endian, self.machine) {
            (64, false, EM_X86_64) => Some("x86_64-linux-gnu"),
            (64, false, EM_AARCH64) => Some("aarch64-linux-gnu"),
            (32, false, EM_386) => Some("i386-linux-gnu"),
            _ => None,
        }
    }
}

/// More program headers than this is not a library we care about.
const MAX_PHNUM: usize = 256;
/// Upper bound on the dynamic section we read (4096 64-bit entries).
const MAX_DYNAMIC: usize = 64 * 1024;
/// Longest SONAME we accept.
const MAX_SONAME: usize = 255;

/// Read an ELF file's class, byte order, machine and `DT_SONAME`, touching only the ELF header,
/// the program headers, the dynamic segment and one string: a few KB, whatever the file's size.
/// The SONAME is found the way the dynamic linker finds it (`PT_DYNAMIC`, `DT_STRTAB` mapped
/// through `PT_LOAD`), so it works on stripped objects without section headers.
pub fn elf_info<R: ReadAt + ?Sized>(r: &R) -> Result<ElfInfo> {
    let mut head = vec![0u8; ELF_HEAD];
    let got = r
        .read_at(0, &mut head)
        .map_err(|e| ParseError::new(format!("reading the ELF header: {e}")))?;
    head.truncate(got);
    let r = &Head {
        whole: got < ELF_HEAD,
        head,
        rest: r,
    };
    let ehdr = elf_header(r)?;
    let mut info = ElfInfo {
        bits: ehdr.bits,
        big_endian: ehdr.f.be,
        machine: ehdr.machine,
        soname: None,
    };
    let segs = program_headers(r, &ehdr)?;
    let Some(dynamic) = &segs.dynamic else {
        return Ok(info);
    };
    let refs = dynamic_refs(r, &ehdr, dynamic)?;
    info.soname = dyn_soname(r, &segs, &refs)?;
    Ok(info)
}

/// Most `DT_NEEDED` entries [`elf_deps`] takes from one object (NVIDIA's tools need 5–7).
pub(crate) const MAX_NEEDED: usize = 64;
/// Longest `PT_INTERP` accepted.
const MAX_INTERP: usize = 255;

/// What the dynamic loader needs to run an ELF program or load a library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElfDeps {
    pub info: ElfInfo,
    /// `PT_INTERP`: the absolute path of the program's loader (`/lib64/ld-linux-x86-64.so.2`).
    pub interp: Option<String>,
    /// `DT_NEEDED`, in order: the libraries the loader loads with it, each a file name.
    pub needed: Vec<String>,
}

/// [`elf_info`] plus the object's loader and needed libraries, found the way the loader finds
/// them (program headers, the dynamic segment, `DT_STRTAB` through `PT_LOAD`). A name that is
/// not a plain file name, or more than [`MAX_NEEDED`] of them, is an error.
pub(crate) fn elf_deps<R: ReadAt + ?Sized>(r: &R) -> Result<ElfDeps> {
    let ehdr = elf_header(r)?;
    let segs = program_headers(r, &ehdr)?;
    let mut deps = ElfDeps {
        info: ElfInfo {
            bits: ehdr.bits,
            big_endian: ehdr.f.be,
            machine: ehdr.machine,
            soname: None,
        },
        interp: None,
        needed: Vec::new(),
    };
    if let Some(p) = &segs.interp {
        deps.interp = Some(read_interp(r, p)?);
    }
    let Some(dynamic) = &segs.dynamic else {
        return Ok(deps);
    };
    let refs = dynamic_refs(r, &ehdr, dynamic)?;
    if refs.needed.len() > MAX_NEEDED {
        return Err(ParseError::new(format!(
            "{} DT_NEEDED entries (at most {MAX_NEEDED} are taken)",
            refs.needed.len()
        )));
    }
    deps.info.soname = dyn_soname(r, &segs, &refs)?;
    let Some(strtab) = refs.strtab else {
        return Ok(deps);
    };
    for off in refs.needed {
        deps.needed.push(read_dyn_name(
            r,
            &segs.loads,
            strtab,
            refs.strsz,
            off,
            "DT_NEEDED",
        )?);
    }
    Ok(deps)
}

/// The loader path `PT_INTERP` names: absolute, NUL-terminated, no `.`/`..` component.
fn read_interp<R: ReadAt + ?Sized>(r: &R, p: &Phdr) -> Result<String> {
    let (Some(off), Some(size)) = (p.offset, p.filesz) else {
        return Err(ParseError::new("truncated PT_INTERP header"));
    };
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if size == 0 || size > MAX_INTERP + 1 {
        return Err(ParseError::new(format!("PT_INTERP of {size} bytes")));
    }
    let raw = read_exact(r, off, size, "PT_INTERP")?;
    // The loader reads up to the first NUL, as the kernel does.
    let raw = raw.split(|&b| b == 0).next().unwrap_or_default();
    let path = std::str::from_utf8(raw)
        .ok()
        .filter(|p| {
            p.starts_with('/')
                && p.split('/')
                    .skip(1)
                    .all(|c| !c.is_empty() && c != "." && c != "..")
        })
        .ok_or_else(|| {
            ParseError::new(format!(
                "PT_INTERP {:?} is not an absolute path without . or .. components",
                String::from_utf8_lossy(raw)
            ))
        })?;
    Ok(path.to_owned())
}

/// What [`elf_info`] takes from the ELF header.
struct Ehdr {
    bits: u8,
    f: Fields,
    machine: u16,
    phoff: u64,
    phentsize: usize,
    phnum: usize,
}

/// The ELF header: class, byte order, machine and where the program headers are.
fn elf_header<R: ReadAt + ?Sized>(r: &R) -> Result<Ehdr> {
    let mut ehdr = [0u8; 64];
    let n = r
        .read_at(0, &mut ehdr)
        .map_err(|e| ParseError::new(format!("reading the ELF header: {e}")))?;
    if n < 52 || ehdr[..4] != *b"\x7fELF" {
        return Err(ParseError::new("not an ELF file"));
    }
    let bits = match ehdr[4] {
        1 => 32u8,
        2 => 64,
        c => return Err(ParseError::new(format!("unknown ELF class {c}"))),
    };
    let be = match ehdr[5] {
        1 => false,
        2 => true,
        d => return Err(ParseError::new(format!("unknown ELF byte order {d}"))),
    };
    if bits == 64 && n < 64 {
        return Err(ParseError::new("truncated ELF header"));
    }
    let f = Fields { be };
    let machine = f.u16(&ehdr, 18).unwrap_or(0);
    let (phoff, phentsize, phnum) = if bits == 64 {
        (f.u64(&ehdr, 32), f.u16(&ehdr, 54), f.u16(&ehdr, 56))
    } else {
        (
            f.u32(&ehdr, 28).map(u64::from),
            f.u16(&ehdr, 42),
            f.u16(&ehdr, 44),
        )
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else {
        return Err(ParseError::new("truncated ELF header"));
    };
    Ok(Ehdr {
        bits,
        f,
        machine,
        phoff,
        phentsize: usize::from(phentsize),
        phnum: usize::from(phnum),
    })
}

/// The program headers [`elf_info`] and [`elf_deps`] use.
#[derive(Default)]
struct Segments {
    loads: Vec<Phdr>,
    dynamic: Option<Phdr>,
    interp: Option<Phdr>,
}

/// The `PT_LOAD`, `PT_DYNAMIC` and `PT_INTERP` headers; no dynamic segment (or no program
/// header at all) names no SONAME and no library.
fn program_headers<R: ReadAt + ?Sized>(r: &R, e: &Ehdr) -> Result<Segments> {
    let (bits, f, phentsize, phnum) = (e.bits, &e.f, e.phentsize, e.phnum);
    let min_phent = if bits == 64 { 56 } else { 32 };
    let mut segs = Segments::default();
    if phnum == 0 {
        return Ok(segs);
    }
    if phentsize < min_phent || phentsize > 256 || phnum > MAX_PHNUM {
        return Err(ParseError::new(format!(
            "implausible program header table ({phnum} entries of {phentsize} bytes)"
        )));
    }
    let table = read_exact(r, e.phoff, phentsize * phnum, "program headers")?;
    for ph in table.chunks_exact(phentsize) {
        let p = if bits == 64 {
            Phdr {
                kind: f.u32(ph, 0),
                offset: f.u64(ph, 8),
                vaddr: f.u64(ph, 16),
                filesz: f.u64(ph, 32),
            }
        } else {
            Phdr {
                kind: f.u32(ph, 0),
                offset: f.u32(ph, 4).map(u64::from),
                vaddr: f.u32(ph, 8).map(u64::from),
                filesz: f.u32(ph, 16).map(u64::from),
            }
        };
        match p.kind {
            Some(1) => segs.loads.push(p),
            Some(2) => segs.dynamic = Some(p),
            Some(3) => segs.interp = Some(p),
            _ => {}
        }
    }
    Ok(segs)
}

/// What the dynamic segment says about names: `DT_STRTAB` (a virtual address), `DT_STRSZ`,
/// and the string-table offsets of `DT_SONAME` and each `DT_NEEDED`.
#[derive(Default)]
struct DynRefs {
    strtab: Option<u64>,
    strsz: Option<u64>,
    soname: Option<u64>,
    needed: Vec<u64>,
}

/// Read the dynamic segment (at most [`MAX_DYNAMIC`] bytes) up to `DT_NULL`.
fn dynamic_refs<R: ReadAt + ?Sized>(r: &R, e: &Ehdr, dynamic: &Phdr) -> Result<DynRefs> {
    let mut refs = DynRefs::default();
    let (Some(dyn_off), Some(dyn_size)) = (dynamic.offset, dynamic.filesz) else {
        return Ok(refs);
    };
    let dyn_size = usize::try_from(dyn_size)
        .unwrap_or(usize::MAX)
        .min(MAX_DYNAMIC);
    let dyn_bytes = read_exact(r, dyn_off, dyn_size, "the dynamic segment")?;
    let entsize = if e.bits == 64 { 16 } else { 8 };
    for d in dyn_bytes.chunks_exact(entsize) {
        let (tag, val) = if e.bits == 64 {
            (e.f.u64(d, 0), e.f.u64(d, 8))
        } else {
            (e.f.u32(d, 0).map(u64::from), e.f.u32(d, 4).map(u64::from))
        };
        match (tag, val) {
            (Some(0), _) => break,
            (Some(1), Some(v)) => refs.needed.push(v),
            (Some(5), Some(v)) => refs.strtab = Some(v),
            (Some(10), Some(v)) => refs.strsz = Some(v),
            (Some(14), Some(v)) => refs.soname = Some(v),
            _ => {}
        }
    }
    Ok(refs)
}

/// `DT_SONAME`, when the dynamic segment names one and a string table.
fn dyn_soname<R: ReadAt + ?Sized>(
    r: &R,
    segs: &Segments,
    refs: &DynRefs,
) -> Result<Option<String>> {
    match (refs.strtab, refs.soname) {
        (Some(strtab), Some(off)) => {
            read_dyn_name(r, &segs.loads, strtab, refs.strsz, off, "DT_SONAME").map(Some)
        }
        _ => Ok(None),
    }
}

/// One name of the dynamic string table (`what`: the tag naming it): `DT_STRTAB` mapped to a
/// file offset through the `PT_LOAD` covering it, then one NUL-terminated file name.
fn read_dyn_name<R: ReadAt + ?Sized>(
    r: &R,
    loads: &[Phdr],
    strtab: u64,
    strsz: Option<u64>,
    name_off: u64,
    what: &str,
) -> Result<String> {
    if strsz.is_some_and(|sz| name_off >= sz) {
        return Err(ParseError::new(format!(
            "{what} points past the string table"
        )));
    }
    let file_off = loads
        .iter()
        .find_map(|l| {
            let (off, va, sz) = (l.offset?, l.vaddr?, l.filesz?);
            (strtab >= va && strtab < va.checked_add(sz)?)
                .then(|| (strtab - va).checked_add(off))?
        })
        .and_then(|o| o.checked_add(name_off))
        .ok_or_else(|| ParseError::new("DT_STRTAB is not inside any PT_LOAD segment"))?;
    let mut buf = [0u8; MAX_SONAME + 1];
    let got = r
        .read_at(file_off, &mut buf)
        .map_err(|e| ParseError::new(format!("reading {what}: {e}")))?;
    let raw = buf.get(..got).unwrap_or_default();
    let len = raw
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| ParseError::new(format!("{what} is not terminated within 255 bytes")))?;
    let name = std::str::from_utf8(raw.get(..len).unwrap_or_default())
        .map_err(|_| ParseError::new(format!("{what} is not UTF-8")))?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(ParseError::new(format!(
            "{what} {name:?} is not a file name"
        )));
    }
    Ok(name.to_owned())
}

/// Bytes [`elf_info`] reads first: the ELF header and up to 17 64-bit program headers (shared
/// objects have 7–14; Debian 12's libc.so.6: 64 + 14 × 56 = 848 bytes), so those cost one
/// `pread`, not two. Discovery reads every driver library at every machine start.
const ELF_HEAD: usize = 1024;

/// A reader that answers from the first bytes of the file when it can.
struct Head<'a, R: ?Sized> {
    head: Vec<u8>,
    /// The file ended within `head`.
    whole: bool,
    rest: &'a R,
}

impl<R: ReadAt + ?Sized> ReadAt for Head<'_, R> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let inside = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(buf.len()))
            .is_some_and(|end| end <= self.head.len());
        if self.whole || inside {
            self.head.as_slice().read_at(offset, buf)
        } else {
            self.rest.read_at(offset, buf)
        }
    }
}

/// [`elf_info`] of bytes in memory.
pub fn elf_info_bytes(bytes: &[u8]) -> Result<ElfInfo> {
    elf_info(bytes)
}

struct Phdr {
    kind: Option<u32>,
    offset: Option<u64>,
    vaddr: Option<u64>,
    filesz: Option<u64>,
}

fn read_exact<R: ReadAt + ?Sized>(r: &R, off: u64, len: usize, what: &str) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = r
        .read_at(off, &mut buf)
        .map_err(|e| ParseError::new(format!("reading {what}: {e}")))?;
    if n < len {
        return Err(ParseError::new(format!(
            "{what} run past the end of the file"
        )));
    }
    Ok(buf)
}

/// Endian-aware field reads that return `None` instead of panicking on short input.
struct Fields {
    be: bool,
}

impl Fields {
    fn u16(&self, b: &[u8], at: usize) -> Option<u16> {
        let raw: [u8; 2] = b.get(at..at.checked_add(2)?)?.try_into().ok()?;
        Some(if self.be {
            u16::from_be_bytes(raw)
        } else {
            u16::from_le_bytes(raw)
        })
    }
    fn u32(&self, b: &[u8], at: usize) -> Option<u32> {
        read_u32(b, at, self.be)
    }
    fn u64(&self, b: &[u8], at: usize) -> Option<u64> {
        let raw: [u8; 8] = b.get(at..at.checked_add(8)?)?.try_into().ok()?;
        Some(if self.be {
            u64::from_be_bytes(raw)
        } else {
            u64::from_le_bytes(raw)
        })
    }
}

mod storage;
pub use storage::{MountEntry, mountinfo, proc_partitions, swaps};

#[cfg(test)]
mod tests;
