//! What the host's kernel says of its storage: `/proc/<pid>/mountinfo`, `/proc/swaps` and
//! `/proc/partitions`, parsed from bytes.

use super::dev_numbers;

/// One line of `/proc/<pid>/mountinfo`: what is mounted where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The `major:minor` of the filesystem (`0:N` for btrfs, tmpfs, overlay: no block device).
    pub major: u32,
    pub minor: u32,
    /// Where it is mounted, unescaped.
    pub mount_point: String,
    /// The mount source (`/dev/sda1`, `/dev/mapper/vg-root`, `tmpfs`), unescaped.
    pub source: String,
}

/// The kernel's octal escapes of a mountinfo or swaps field (`\040` is a space) undone.
fn unescape_octal(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b[i] == b'\\'
            && b.len() >= i + 4
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c));
        if octal {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse `/proc/<pid>/mountinfo`. A line that is not the kernel's shape is skipped: the caller
/// looks for what the host uses, and a line it cannot read names nothing it could take.
pub fn mountinfo(bytes: &[u8]) -> Vec<MountEntry> {
    let text = String::from_utf8_lossy(bytes);
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if dash < 6 || fields.len() < dash + 3 {
            continue;
        }
        let Ok((major, minor)) = dev_numbers(fields[2].as_bytes()) else {
            continue;
        };
        out.push(MountEntry {
            major,
            minor,
            mount_point: unescape_octal(fields[4]),
            source: unescape_octal(fields[dash + 2]),
        });
    }
    out
}

/// The file names `/proc/swaps` lists (a partition, a dm device or a swap file), unescaped.
pub fn swaps(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(unescape_octal)
        .collect()
}

/// Parse `/proc/partitions`: every block device with a size (disks, partitions, device mapper
/// and md devices), as (major, minor, kernel name), in file order. The kernel writes a `/` of a
/// name as is (`cciss/c0d0`). The header and any line not of the kernel's shape are skipped.
pub fn proc_partitions(bytes: &[u8]) -> Vec<(u32, u32, String)> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (Some(major), Some(minor), Some(blocks), Some(name), None) =
                (w.next(), w.next(), w.next(), w.next(), w.next())
            else {
                return None;
            };
            blocks.parse::<u64>().ok()?;
            Some((major.parse().ok()?, minor.parse().ok()?, name.to_owned()))
        })
        .collect()
}
