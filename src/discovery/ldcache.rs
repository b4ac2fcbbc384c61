//! glibc's dynamic-linker cache (`/etc/ld.so.cache`): read the one an image has, add the driver's
//! libraries, write it back. Pure: bytes in, bytes out. The crate's one reader of the format
//! (host discovery reads through [`each`]) and its one writer ([`render`], the fixtures' too).
//!
//! Why we write the cache ourselves instead of running `ldconfig` for the container: the
//! container's `ldconfig` is image code, and running it as root before the container is
//! sealed is the CVE-2025-23266 class of bug; the machine's `ldconfig -r <rootfs>` is not image
//! code, but it parses every ELF file of the image and writes through the image's symlinks as
//! root, and a Debian machine's `ldconfig` may not even agree with an older image's loader on the
//! cache format. What a loader needs from the cache is small and stable since glibc 2.3: the
//! "new" format (`glibc-ld.so.cache1.1`), a sorted table of (flags, SONAME, path). We keep every
//! entry the image's own cache had (so nothing the image found before is lost), drop the image's
//! entries for the driver's SONAMEs (a stale `libcuda.so.1` from an older driver), add ours, and
//! sort the table the way `ldconfig` does so the loader's binary search finds every entry.
//!
//! Layout (glibc `sysdeps/generic/dl-cache.h`), all integers in the machine's byte order:
//! header of 48 bytes (`glibc-ld.so.cache` + `1.1`, `nlibs`, `len_strings`, a flags byte, 3
//! padding bytes, `extension_offset`, 3 unused words), then `nlibs` entries of 24 bytes
//! (`flags: i32, key: u32, value: u32, osversion: u32, hwcap: u64`), then the string table.
//! String offsets count from the start of the header. An optional extension block (magic
//! `0xEAA42174`) names the `glibc-hwcaps` subdirectories that entries with bit 62 of `hwcap`
//! refer to by index; we keep it for the image's entries.

use crate::types::bytes::{read_u32, read_u64};
use anyhow::{Result, bail};

const MAGIC_NEW: &[u8] = b"glibc-ld.so.cache1.1";
const MAGIC_OLD: &[u8] = b"ld.so-1.7.0";
const HEADER_LEN: usize = 48;
const ENTRY_LEN: usize = 24;
const OLD_ENTRY_LEN: usize = 12;
const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
const TAG_GLIBC_HWCAPS: u32 = 1;
/// `DL_CACHE_HWCAP_EXTENSION`: the low 32 bits of `hwcap` index the glibc-hwcaps names.
const HWCAP_EXTENSION: u64 = 1 << 62;
/// The largest cache we read; a real one is tens of kilobytes.
pub const MAX_CACHE: usize = 16 << 20;

/// `FLAG_ELF_LIBC6`.
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_ELF_LIBC6 | FLAG_X8664_LIB64`: what `ldconfig -p` prints as `(libc6,x86-64)`.
pub const FLAGS_X86_64: i32 = 0x0303;
/// `FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64`: `(libc6,AArch64)`.
pub const FLAGS_AARCH64: i32 = 0x0a03;

/// One cache entry: a SONAME and the path the loader opens for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub flags: i32,
    pub soname: String,
    pub path: String,
    /// `Some(name)` for a library in a `glibc-hwcaps/<name>` subdirectory.
    pub hwcaps: Option<String>,
    /// Any other `hwcap` bits (legacy hwcap subdirectories), kept as they were.
    pub hwcap: u64,
}

impl Entry {
    /// A plain entry for one of the driver's libraries.
    pub fn new(flags: i32, soname: &str, path: &str) -> Entry {
        Entry {
            flags,
            soname: soname.to_owned(),
            path: path.to_owned(),
            hwcaps: None,
            hwcap: 0,
        }
    }
}

/// The cache flags for a library in the multiarch directory `dir` (`/usr/lib/<triplet>/…`), or
/// for this build's own architecture when the path names no known triplet.
pub fn flags_for(path: &str) -> i32 {
    if path.contains("/x86_64-linux-gnu/") {
        FLAGS_X86_64
    } else if path.contains("/aarch64-linux-gnu/") {
        FLAGS_AARCH64
    } else if path.contains("/i386-linux-gnu/") || path.contains("/arm-linux-gnueabihf/") {
        FLAG_ELF_LIBC6
    } else if cfg!(target_arch = "aarch64") {
        FLAGS_AARCH64
    } else {
        FLAGS_X86_64
    }
}

/// Most entries we read: Debian's cache lists a few thousand libraries. Each entry costs UTF-8
/// checks of strings up to 4 KiB, so a 16 MiB cache of 700 000 entries is seconds of work.
pub const MAX_CACHE_ENTRIES: u32 = 1 << 16;
/// Longest name or path we read out of the string table.
const MAX_CACHE_STRING: usize = 4096;
/// The old format's header: magic[11], pad, nlibs u32.
const OLD_HEADER_LEN: usize = 16;

/// One entry as it stands in the file: the strings as bytes, `hwcap` as written.
#[derive(Debug, Clone, Copy)]
struct RawEntry<'a> {
    flags: u32,
    key: &'a [u8],
    path: &'a [u8],
    hwcap: u64,
}

/// One `ld.so.cache` entry: `libcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1`.
///
/// It borrows its strings from the cache: entries may share one string, so owned copies could
/// cost far more than the file (a 16 MiB cache of 700 000 entries naming one 4 KiB path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LdCacheEntry<'a> {
    /// The SONAME (or file name) the dynamic linker looks up.
    pub key: &'a str,
    /// The absolute path it maps to.
    pub path: &'a str,
    /// glibc's `FLAG_*` bits: the low byte is the library type (3 = libc6), the next the
    /// required ABI (`0x0300` x86-64, `0x0a00` AArch64, 0 for i386 on x86 hosts).
    pub flags: u32,
}

/// Every entry of a cache, borrowed (see [`each`]).
pub fn entries(bytes: &[u8]) -> Result<Vec<LdCacheEntry<'_>>> {
    let mut out = Vec::new();
    each(bytes, |e| out.push(e))?;
    Ok(out)
}

/// Read a glibc `ld.so.cache`: the `glibc-ld.so.cache1.1` format (Debian 12's default), the old
/// `ld.so-1.7.0` format with the new one appended (what older ldconfig wrote by default), or the
/// old format alone. `f` sees each entry in file order, in constant memory; entries whose key or
/// path is not UTF-8 are skipped. On an error `f` may already have seen some entries; the caller
/// discards them.
pub fn each<'a>(bytes: &'a [u8], mut f: impl FnMut(LdCacheEntry<'a>)) -> Result<()> {
    each_raw(bytes, |e| {
        if let (Ok(key), Ok(path)) = (std::str::from_utf8(e.key), std::str::from_utf8(e.path)) {
            f(LdCacheEntry {
                key,
                path,
                flags: e.flags,
            });
        }
        Ok(())
    })
}

/// Where the new-format table starts, and whether the file is in the old format alone.
enum Layout {
    New(usize),
    OldOnly { nlibs: u32, entries_end: usize },
}

fn layout(bytes: &[u8]) -> Result<Layout> {
    if bytes.starts_with(MAGIC_NEW) {
        return Ok(Layout::New(0));
    }
    if !bytes.starts_with(MAGIC_OLD) {
        bail!("not an ld.so.cache (neither \"glibc-ld.so.cache1.1\" nor \"ld.so-1.7.0\" magic)");
    }
    let Some(nlibs) = read_u32(bytes, 12, false) else {
        bail!("truncated header");
    };
    check_entry_count(nlibs)?;
    let Some(entries_end) = usize::try_from(nlibs)
        .ok()
        .and_then(|n| n.checked_mul(OLD_ENTRY_LEN))
        .and_then(|n| n.checked_add(OLD_HEADER_LEN))
        .filter(|&end| end <= bytes.len())
    else {
        bail!("{nlibs} entries do not fit in {} bytes", bytes.len());
    };
    // The new format hides in the old one's string table, aligned like `struct cache_file_new`.
    let new_start = entries_end.next_multiple_of(8);
    if bytes
        .get(new_start..)
        .is_some_and(|b| b.starts_with(MAGIC_NEW))
    {
        return Ok(Layout::New(new_start));
    }
    Ok(Layout::OldOnly { nlibs, entries_end })
}

/// The one reader of the file's layout: [`each`] and [`parse`] are views of it.
fn each_raw<'a>(bytes: &'a [u8], mut f: impl FnMut(RawEntry<'a>) -> Result<()>) -> Result<()> {
    let (nlibs, entries_end) = match layout(bytes)? {
        Layout::New(base) => return each_new(bytes, base, &mut f),
        Layout::OldOnly { nlibs, entries_end } => (nlibs, entries_end),
    };
    let table = Table {
        bytes,
        first: OLD_HEADER_LEN,
        stride: OLD_ENTRY_LEN,
        strings: entries_end,
        big_endian: false,
        has_hwcap: false,
    };
    table.each(nlibs, f)
}

/// The new-format header at `base` and whether its integers are big-endian.
fn new_header(bytes: &[u8], base: usize) -> Result<(&[u8], bool)> {
    let Some(header) = bytes.get(base..).filter(|h| h.len() >= HEADER_LEN) else {
        bail!("truncated glibc-ld.so.cache1.1 header");
    };
    // cache_file_new.flags: 2 little-endian, 3 big-endian, 0 unset (written by old ldconfig on
    // little-endian machines, the only ones we run on).
    let big_endian = match header.get(28).copied().unwrap_or(0) & 3 {
        0 | 2 => false,
        3 => true,
        _ => bail!("header says its byte order is invalid"),
    };
    Ok((header, big_endian))
}

fn each_new<'a>(
    bytes: &'a [u8],
    base: usize,
    f: &mut impl FnMut(RawEntry<'a>) -> Result<()>,
) -> Result<()> {
    let (header, big_endian) = new_header(bytes, base)?;
    let nlibs = read_u32(header, 20, big_endian).unwrap_or(0);
    check_entry_count(nlibs)?;
    if usize::try_from(nlibs)
        .ok()
        .and_then(|n| n.checked_mul(ENTRY_LEN))
        .and_then(|n| n.checked_add(HEADER_LEN))
        .is_none_or(|end| end > header.len())
    {
        bail!("{nlibs} entries do not fit in {} bytes", header.len());
    }
    // String offsets of the new format count from its own header.
    let table = Table {
        bytes: header,
        first: HEADER_LEN,
        stride: ENTRY_LEN,
        strings: 0,
        big_endian,
        has_hwcap: true,
    };
    table.each(nlibs, f)
}

/// An entry table: `flags`, key and value offsets as u32 at the start of each entry (the new
/// format's `hwcap` u64 at byte 16), strings counted from `strings`.
struct Table<'a> {
    bytes: &'a [u8],
    first: usize,
    stride: usize,
    strings: usize,
    big_endian: bool,
    has_hwcap: bool,
}

impl<'a> Table<'a> {
    fn each(&self, nlibs: u32, mut f: impl FnMut(RawEntry<'a>) -> Result<()>) -> Result<()> {
        let (b, be) = (self.bytes, self.big_endian);
        for i in 0..nlibs as usize {
            let at = self.first + i * self.stride;
            let hwcap = match self.has_hwcap {
                true => read_u64(b, at + 16, be),
                false => Some(0),
            };
            let (Some(flags), Some(key), Some(value), Some(hwcap)) = (
                read_u32(b, at, be),
                read_u32(b, at + 4, be),
                read_u32(b, at + 8, be),
                hwcap,
            ) else {
                bail!("truncated entry");
            };
            f(RawEntry {
                flags,
                key: cstr_at(b, self.strings, key)?,
                path: cstr_at(b, self.strings, value)?,
                hwcap,
            })?;
        }
        Ok(())
    }
}

fn check_entry_count(nlibs: u32) -> Result<()> {
    if nlibs > MAX_CACHE_ENTRIES {
        bail!("{nlibs} entries; more than {MAX_CACHE_ENTRIES} is not a cache ldconfig wrote");
    }
    Ok(())
}

fn cstr_at(bytes: &[u8], base: usize, off: u32) -> Result<&[u8]> {
    let Some(start) = usize::try_from(off)
        .ok()
        .and_then(|o| o.checked_add(base))
        .filter(|&s| s < bytes.len())
    else {
        bail!("string offset {off} is outside the file");
    };
    let tail = bytes.get(start..).unwrap_or_default();
    let window = tail
        .get(..MAX_CACHE_STRING.min(tail.len()))
        .unwrap_or_default();
    let Some(len) = window.iter().position(|&b| b == 0) else {
        bail!("string at offset {off} is not terminated");
    };
    Ok(window.get(..len).unwrap_or_default())
}

/// The entries of a cache file as owned values the writer can merge and [`render`] again, in
/// file order, with their glibc-hwcaps subdirectory names resolved. Read by [`each`]'s reader;
/// on top of it a name or path that is not UTF-8 is an error here (it could not be written
/// back), as is anything else malformed.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>> {
    if bytes.len() > MAX_CACHE {
        bail!("larger than {MAX_CACHE} bytes");
    }
    let hwcaps = match layout(bytes)? {
        Layout::New(base) => {
            let (header, big_endian) = new_header(bytes, base)?;
            match read_u32(header, 32, big_endian) {
                Some(0) | None => Vec::new(),
                Some(off) => parse_hwcaps(header, off as usize, big_endian)?,
            }
        }
        Layout::OldOnly { .. } => Vec::new(),
    };
    let mut out = Vec::new();
    each_raw(bytes, |e| {
        let text = |b: &[u8]| match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => bail!("{:?} is not UTF-8", String::from_utf8_lossy(b)),
        };
        let soname = text(e.key)?;
        let (hwcaps_name, hwcap) = if e.hwcap & HWCAP_EXTENSION != 0 {
            let idx = (e.hwcap & 0xffff_ffff) as usize;
            match hwcaps.get(idx) {
                Some(name) => (Some(name.clone()), 0),
                None => {
                    bail!("entry {soname} names glibc-hwcaps index {idx}, which does not exist")
                }
            }
        } else {
            (None, e.hwcap)
        };
        out.push(Entry {
            flags: e.flags as i32,
            soname,
            path: text(e.path)?,
            hwcaps: hwcaps_name,
            hwcap,
        });
        Ok(())
    })?;
    Ok(out)
}

/// The glibc-hwcaps subdirectory names of the extension block at `off` of the new-format
/// `header`.
fn parse_hwcaps(header: &[u8], off: usize, big_endian: bool) -> Result<Vec<String>> {
    let word = |at: usize| match read_u32(header, at, big_endian) {
        Some(w) => Ok(w),
        None => bail!("truncated at offset {at}"),
    };
    if word(off)? != EXTENSION_MAGIC {
        bail!("extension block at {off} has no magic");
    }
    let count = word(off + 4)? as usize;
    if count > 64 {
        bail!("{count} extension sections");
    }
    let mut names = Vec::new();
    for s in 0..count {
        let at = off + 8 + s * 16;
        if word(at)? != TAG_GLIBC_HWCAPS {
            continue;
        }
        let (data, size) = (word(at + 8)? as usize, word(at + 12)? as usize);
        if size % 4 != 0 || size / 4 > 4096 {
            bail!("glibc-hwcaps section of {size} bytes");
        }
        for k in 0..size / 4 {
            let name = cstr_at(header, 0, word(data + 4 * k)?)?;
            match std::str::from_utf8(name) {
                Ok(n) => names.push(n.to_owned()),
                Err(_) => bail!("glibc-hwcaps name at {data} is not UTF-8"),
            }
        }
    }
    Ok(names)
}

/// glibc's `_dl_cache_libcmp`: runs of digits compare as numbers, a digit sorts after any other
/// character.
pub fn libcmp(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    loop {
        match (a.get(i), b.get(j)) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (si, sj) = (i, j);
                while a.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
                while b.get(j).is_some_and(u8::is_ascii_digit) {
                    j += 1;
                }
                // Compare as numbers without overflow: strip leading zeros, then length, then digits.
                let na = trim_zeros(&a[si..i]);
                let nb = trim_zeros(&b[sj..j]);
                let ord = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
            (Some(x), Some(_)) if x.is_ascii_digit() => return Ordering::Greater,
            (Some(_), Some(y)) if y.is_ascii_digit() => return Ordering::Less,
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                i += 1;
                j += 1;
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|&&c| c == b'0').count();
    &d[n.min(d.len().saturating_sub(1))..]
}

/// `existing` (the image's entries) with every entry for one of `ours`' SONAMEs and flags
/// replaced by ours, in the order `ldconfig` writes: SONAMEs descending by [`libcmp`] (the
/// loader's binary search relies on it), for one SONAME higher flags first and glibc-hwcaps
/// entries before plain ones, otherwise the image's own order.
pub fn merge(existing: Vec<Entry>, ours: &[Entry]) -> Vec<Entry> {
    let mut all: Vec<Entry> = existing
        .into_iter()
        .filter(|e| {
            !ours
                .iter()
                .any(|o| o.soname == e.soname && o.flags == e.flags)
        })
        .collect();
    for o in ours {
        if !all.contains(o) {
            all.push(o.clone());
        }
    }
    all.sort_by(|a, b| {
        libcmp(&b.soname, &a.soname)
            .then_with(|| b.flags.cmp(&a.flags))
            .then_with(|| b.hwcaps.is_some().cmp(&a.hwcaps.is_some()))
    });
    all
}

/// The new-format cache file holding `entries` in the given order.
pub fn render(entries: &[Entry]) -> Vec<u8> {
    let mut hwcaps: Vec<&str> = Vec::new();
    for e in entries {
        if let Some(h) = &e.hwcaps
            && !hwcaps.contains(&h.as_str())
        {
            hwcaps.push(h);
        }
    }
    // String table right after the entries, each distinct string once.
    let mut strings = Strings {
        base: HEADER_LEN + entries.len() * ENTRY_LEN,
        bytes: Vec::new(),
        offsets: std::collections::HashMap::new(),
    };
    let mut table = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for e in entries {
        let key = strings.offset(&e.soname);
        let value = strings.offset(&e.path);
        let hwcap = match &e.hwcaps {
            Some(h) => {
                let idx = hwcaps
                    .iter()
                    .position(|x| *x == h.as_str())
                    .expect("every hwcaps name was collected above");
                HWCAP_EXTENSION | idx as u64
            }
            None => e.hwcap,
        };
        table.extend_from_slice(&e.flags.to_ne_bytes());
        table.extend_from_slice(&key.to_ne_bytes());
        table.extend_from_slice(&value.to_ne_bytes());
        table.extend_from_slice(&0u32.to_ne_bytes());
        table.extend_from_slice(&hwcap.to_ne_bytes());
    }
    let hwcap_offsets: Vec<u32> = hwcaps.iter().map(|h| strings.offset(h)).collect();
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC_NEW);
    out.extend_from_slice(&small(entries.len()).to_ne_bytes());
    out.extend_from_slice(&small(strings.bytes.len()).to_ne_bytes());
    // cache_file_new_flags_endian_little / _big.
    out.push(if cfg!(target_endian = "little") { 2 } else { 3 });
    out.extend_from_slice(&[0; 3]);
    let ext_at = out.len();
    out.extend_from_slice(&[0; 16]);
    debug_assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(&table);
    out.extend_from_slice(&strings.bytes);
    if !hwcaps.is_empty() {
        while out.len() % 4 != 0 {
            out.push(0);
        }
        let ext = small(out.len());
        out[ext_at..ext_at + 4].copy_from_slice(&ext.to_ne_bytes());
        // Magic, one section (tag, flags, offset, size), then the section's data.
        for word in [
            EXTENSION_MAGIC,
            1,
            TAG_GLIBC_HWCAPS,
            0,
            ext + 8 + 16,
            small(4 * hwcap_offsets.len()),
        ] {
            out.extend_from_slice(&word.to_ne_bytes());
        }
        for o in hwcap_offsets {
            out.extend_from_slice(&o.to_ne_bytes());
        }
    }
    out
}

/// A cache's string table being built.
struct Strings {
    /// Offset of the table from the start of the header.
    base: usize,
    bytes: Vec<u8>,
    offsets: std::collections::HashMap<String, u32>,
}

impl Strings {
    fn offset(&mut self, s: &str) -> u32 {
        if let Some(&o) = self.offsets.get(s) {
            return o;
        }
        let o = small(self.base + self.bytes.len());
        self.bytes.extend_from_slice(s.as_bytes());
        self.bytes.push(0);
        self.offsets.insert(s.to_owned(), o);
        o
    }
}

/// A size or offset in a cache, which [`parse`] caps at [`MAX_CACHE`] and our entries keep far
/// below that.
fn small(n: usize) -> u32 {
    u32::try_from(n).expect("an ld.so.cache stays far below 4 GiB")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    #[test]
    fn libcmp_is_glibcs() {
        assert_eq!(libcmp("libc.so.6", "libc.so.6"), Ordering::Equal);
        assert_eq!(libcmp("libcuda.so.1", "libcuda.so.10"), Ordering::Less);
        assert_eq!(libcmp("libx.so.9", "libx.so.10"), Ordering::Less);
        // A digit sorts after a letter (and after '.').
        assert_eq!(libcmp("lib1", "liba"), Ordering::Greater);
        assert_eq!(libcmp("libz.so", "libz.so.1"), Ordering::Less);
        assert_eq!(libcmp("a", "b"), Ordering::Less);
    }

    #[test]
    fn round_trip_keeps_order_and_hwcaps() {
        let mut hw = Entry::new(
            FLAGS_X86_64,
            "libm.so.6",
            "/usr/lib/glibc-hwcaps/x86-64-v3/libm.so.6",
        );
        hw.hwcaps = Some("x86-64-v3".into());
        let entries = merge(
            vec![
                Entry::new(FLAGS_X86_64, "libc.so.6", "/lib64/libc.so.6"),
                Entry::new(FLAGS_X86_64, "libm.so.6", "/lib64/libm.so.6"),
                hw,
                Entry::new(
                    FLAGS_X86_64,
                    "libcuda.so.1",
                    "/usr/lib64/libcuda.so.470.57.02",
                ),
            ],
            &[Entry::new(
                FLAGS_X86_64,
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            )],
        );
        let names: Vec<_> = entries.iter().map(|e| e.soname.as_str()).collect();
        assert_eq!(
            names,
            ["libm.so.6", "libm.so.6", "libcuda.so.1", "libc.so.6"]
        );
        assert!(entries[0].hwcaps.is_some(), "hwcaps entry first");
        assert_eq!(entries[2].path, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        let bytes = render(&entries);
        assert_eq!(parse(&bytes).unwrap(), entries);
    }

    /// An `ld.so-1.7.0` cache alone (glibc before 2.2), `(key, path, flags)` in file order.
    fn old_format(entries: &[(&str, &str, u32)]) -> Vec<u8> {
        let mut out = b"ld.so-1.7.0\0".to_vec();
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        let mut strings = Vec::new();
        for (key, path, flags) in entries {
            out.extend_from_slice(&flags.to_le_bytes());
            for s in [key, path] {
                out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
                strings.extend_from_slice(s.as_bytes());
                strings.push(0);
            }
        }
        out.extend_from_slice(&strings);
        out
    }

    /// One reader: what discovery reads of a cache (borrowed, [`each`]) and what the writer
    /// reads to merge into (owned, [`parse`]) are the same entries, in every layout. (They were
    /// two parsers: the writer's read an old-format cache as empty.)
    #[test]
    fn discovery_and_the_writer_read_the_same_entries() {
        let list = [
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                0x0303,
            ),
            ("libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", 0x0a03),
        ];
        let new = render(
            &list
                .iter()
                .map(|&(k, p, f)| Entry::new(f as i32, k, p))
                .collect::<Vec<_>>(),
        );
        for (name, bytes) in [("new", new), ("old", old_format(&list))] {
            let borrowed: Vec<(String, String, u32)> = crate::discovery::parse::ld_so_cache(&bytes)
                .unwrap()
                .iter()
                .map(|e| (e.key.to_owned(), e.path.to_owned(), e.flags))
                .collect();
            let owned: Vec<(String, String, u32)> = parse(&bytes)
                .unwrap()
                .into_iter()
                .map(|e| (e.soname, e.path, e.flags as u32))
                .collect();
            assert_eq!(borrowed.len(), 2, "{name}");
            assert_eq!(owned, borrowed, "{name}");
        }
    }

    /// One writer: the test fixtures' caches are the product's.
    #[test]
    fn fixture_caches_are_written_by_the_one_writer() {
        let list = [
            ("libcuda.so.1", "/opt/nv/libcuda.so.1", 0x0303),
            ("libcuda.so.1", "/opt/nv/libcuda.so.1", 0x0a03),
        ];
        let ours: Vec<Entry> = list
            .iter()
            .map(|&(k, p, f)| Entry::new(f as i32, k, p))
            .collect();
        assert_eq!(crate::fixture::ld_so_cache(&list), render(&ours));
    }

    #[test]
    fn malformed_caches_are_errors_not_panics() {
        let good = render(&[Entry::new(FLAGS_X86_64, "liba.so.1", "/lib/liba.so.1")]);
        for cut in 0..good.len() {
            let _ = parse(&good[..cut]);
        }
        assert!(parse(b"garbage").is_err());
        let mut bad = good.clone();
        bad[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse(&bad).is_err());
        let mut bad = good;
        bad[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&9999u32.to_ne_bytes());
        assert!(parse(&bad).is_err());
    }
}

#[cfg(test)]
mod host_tests {
    use super::*;

    /// The entry lines of `ldconfig -p` (not the count, nor the "generated by" line, which comes
    /// from an extension section we do not write).
    fn entry_lines(out: &str) -> Vec<&str> {
        out.lines().filter(|l| l.starts_with('\t')).collect()
    }

    /// The host's own cache, written by glibc's ldconfig: we read every entry, our sort keeps
    /// ldconfig's order, and `ldconfig -p -C` prints our rendering exactly as it prints the original.
    #[test]
    fn host_cache_round_trips_through_glibc_ldconfig() {
        let original = std::fs::read("/etc/ld.so.cache").expect("this Debian host has a cache");
        let entries = parse(&original).unwrap();
        assert!(entries.len() > 10, "{entries:?}");
        let merged = merge(entries.clone(), &[]);
        assert_eq!(merged, entries, "ldconfig's order is ours");
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("ld.so.cache");
        std::fs::write(&ours, render(&merged)).unwrap();
        let print = |cache: &std::path::Path| {
            let out = std::process::Command::new("ldconfig")
                .arg("-p")
                .arg("-C")
                .arg(cache)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let a = print(std::path::Path::new("/etc/ld.so.cache"));
        let b = print(&ours);
        let (a, b): (Vec<_>, Vec<_>) = (entry_lines(&a), entry_lines(&b));
        let diff: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).take(3).collect();
        assert!(
            diff.is_empty() && a.len() == b.len(),
            "{} vs {} lines; first differences {diff:?}",
            a.len(),
            b.len()
        );
    }
}
