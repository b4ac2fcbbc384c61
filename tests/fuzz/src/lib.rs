//! One entry point per parser of untrusted bytes, shared by the cargo-fuzz targets
//! (`fuzz_targets/`, through this crate's library) and the corpus replay test of the main crate
//! (`tests/fuzz_corpus.rs`, which includes this file as a module), so CI on stable runs every
//! committed corpus file through exactly the code libFuzzer explored. It lives here, not in the
//! main crate, so the product binary carries no fuzz entry point; it uses only the main crate's
//! public API.
//!
//! Each entry point accepts any bytes. A parser may reject them; it must not panic, and what it
//! accepts must hold the invariants the rest of the helper relies on (checked here with
//! `assert!`, which is how libFuzzer learns of a violation).

use nspawn_lifecycle::config::Config;
use nspawn_lifecycle::discovery::parse::{self, PciAddress};
use nspawn_lifecycle::error::exit_code;
use nspawn_lifecycle::fs::host::HostRoot;
use nspawn_lifecycle::types::machine_name::MachineName;

/// A fuzz target: its name (the directory under `tests/fuzz/corpus/`) and its entry point.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target, by the name cargo-fuzz knows it by.
pub const TARGETS: &[Target] = &[
    ("nvidia_version", nvidia_version),
    ("driver_version", driver_version),
    ("gpu_information", gpu_information),
    ("proc_devices", proc_devices),
    ("pci_id", pci_id),
    ("pci_address", pci_address),
    ("ld_so_cache", ld_so_cache),
    ("elf_info", elf_info),
    ("config", config),
    ("machine_name", machine_name),
];

/// `/proc/driver/nvidia/version`: an accepted version is one [`parse::is_version`] passes (it ends
/// up in file names) and comes from the first line.
pub fn nvidia_version(data: &[u8]) {
    if let Ok(k) = parse::nvidia_version(data) {
        assert!(parse::is_version(&k.version), "{k:?}");
        let first = data.split(|&b| b == b'\n').next().unwrap_or_default();
        assert!(
            first
                .windows(k.version.len())
                .any(|w| w == k.version.as_bytes()),
            "{k:?} is not on the first line"
        );
    }
}

/// [`parse::is_version`] and [`parse::cmp_versions`] on two strings split at the first `\n`:
/// a version is path-safe, and the comparison is a total order.
pub fn driver_version(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (a, b) = text.split_once('\n').unwrap_or((text, "1.0"));
    for v in [a, b] {
        if parse::is_version(v) {
            assert!(
                !v.contains('/') && v != "." && v != ".." && v.len() <= 32,
                "{v:?}"
            );
        }
    }
    if parse::is_version(a) && parse::is_version(b) {
        use std::cmp::Ordering::Equal;
        let ab = parse::cmp_versions(a, b);
        assert_eq!(ab.reverse(), parse::cmp_versions(b, a), "{a:?} {b:?}");
        assert_eq!(parse::cmp_versions(a, a), Equal);
        assert_eq!(ab == Equal, a == b, "{a:?} {b:?}");
    }
}

/// `/proc/driver/nvidia/gpus/<bus>/information`: accepted fields are trimmed and free of
/// control characters (they reach a terminal), and the UUID is safe in a CDI device name.
pub fn gpu_information(data: &[u8]) {
    if let Ok(g) = parse::gpu_information(data) {
        for field in [&g.model, &g.uuid, &g.bus_location] {
            assert!(
                !field.is_empty() && !field.contains(char::is_control),
                "{g:?}"
            );
            assert_eq!(field.trim(), field, "{g:?}");
        }
        assert!(g.uuid.starts_with("GPU-") && g.uuid.len() <= 64, "{g:?}");
        assert!(
            g.uuid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "{g:?}"
        );
    }
}

/// `/proc/devices`: every accepted driver name is one non-empty word, and there are no more
/// entries than lines.
pub fn proc_devices(data: &[u8]) {
    if let Ok(table) = parse::proc_devices(data) {
        let lines = data.split(|&b| b == b'\n').count();
        assert!(
            table.len() <= lines,
            "{} entries from {lines} lines",
            table.len()
        );
        for (_, name) in &table {
            assert!(
                !name.is_empty() && !name.contains(char::is_whitespace),
                "{name:?}"
            );
        }
    }
}

/// A PCI sysfs `vendor`/`device` file: what is accepted is exactly what the kernel writes for
/// that id (`0x%04x`), so the parser cannot read a different id out of something else.
pub fn pci_id(data: &[u8]) {
    if let Ok(id) = parse::pci_id(data) {
        let text = std::str::from_utf8(data).unwrap_or_default();
        let shown = text.trim_end_matches('\n').to_ascii_lowercase();
        assert_eq!(shown, format!("0x{id:04x}"), "{data:?}");
    }
}

/// A PCI bus id (a directory name under /proc and /sys): an accepted one prints back to a form
/// that parses to the same address, and carries nothing that could change a path.
pub fn pci_address(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(a) = PciAddress::parse(text) {
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.'),
            "{text:?}"
        );
        let shown = a.to_string();
        assert_eq!(PciAddress::parse(&shown), Some(a), "{text:?} -> {shown:?}");
        assert!(a.device < 32 && a.function < 8, "{a:?}");
    }
}

/// `/etc/ld.so.cache`: entries are NUL-free, bounded strings, and there cannot be more of them
/// than fit in the input.
pub fn ld_so_cache(data: &[u8]) {
    if let Ok(entries) = parse::ld_so_cache(data) {
        assert!(
            entries.len() <= data.len() / 12,
            "{} entries",
            entries.len()
        );
        for e in &entries {
            for s in [&e.key, &e.path] {
                assert!(!s.contains('\0') && s.len() < 4096, "{e:?}");
            }
        }
    }
}

/// An ELF object's header, program headers, dynamic segment and `DT_SONAME`: a SONAME is a
/// single file name (it becomes a link name in the machine).
pub fn elf_info(data: &[u8]) {
    if let Ok(info) = parse::elf_info_bytes(data) {
        assert!(info.bits == 32 || info.bits == 64, "{info:?}");
        if let Some(s) = &info.soname {
            assert!(
                !s.is_empty() && s.len() <= 255 && !s.contains(['/', '\0']),
                "{info:?}"
            );
            assert!(s != "." && s != "..", "{info:?}");
        }
    }
}

/// A host root where nothing exists: a directory opened, then removed, so every lookup under
/// it finds nothing (the root is a descriptor, no path names it any more).
fn empty_host() -> &'static HostRoot {
    static HOST: std::sync::OnceLock<HostRoot> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("nspawn-lifecycle-fuzz-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let host = HostRoot::new(&dir);
        std::fs::remove_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        host
    })
}

/// The JSON config file: whatever it accepts resolves for a machine later without surprises
/// (the helper does that on every start without re-checking the JSON): settings come out, or
/// the one host-dependent check (mount sources exist) fails as bad input. Every accepted mount
/// path and unit name renders to a `.nspawn` line that systemd reads back as the same paths.
pub fn config(data: &[u8]) {
    if let Ok(cfg) = Config::parse(data) {
        assert!(cfg.helper_path().starts_with('/'), "{cfg:?}");
        let host = empty_host();
        for name in ["kube1", "gpu-node-01.example"] {
            let machine: MachineName = name.parse().unwrap_or_else(|e| panic!("{e}"));
            match cfg.machine(host, &machine) {
                Ok(mc) => {
                    assert!(mc.directory.starts_with('/'), "{mc:?}");
                    for unit in [&mc.kubelet_unit, &mc.containerd_unit] {
                        assert_reads_back(
                            nspawn_lifecycle::model::gate::HOST_FILE,
                            &nspawn_lifecycle::model::gate::dropin(unit),
                        );
                    }
                }
                Err(e) => assert_eq!(exit_code(&e), 2, "{e:#}"),
            }
        }
        // Mount sources need not exist here, so check the accepted JSON values themselves.
        let v: serde_json::Value =
            serde_json::from_slice(data).unwrap_or_else(|e| panic!("accepted yet not JSON: {e}"));
        let settings = std::iter::once(&v["defaults"]).chain(
            v["machines"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values()),
        );
        for s in settings {
            for m in s["mounts"].as_array().into_iter().flatten() {
                let source = m["source"].as_str().unwrap_or_else(|| panic!("{m}"));
                let target = m["target"].as_str().unwrap_or(source);
                assert_reads_back(source, target);
            }
        }
    }
}

/// `source` → `target` rendered as a bind line reads back (as systemd 252 reads it) unchanged.
fn assert_reads_back(source: &str, target: &str) {
    use nspawn_lifecycle::model::nspawn::BindLine;
    use nspawn_lifecycle::types::paths::parse_bind_line;
    for read_only in [true, false] {
        let line = BindLine {
            source: source.parse().unwrap_or_else(|e| panic!("{e}")),
            target: target.parse().unwrap_or_else(|e| panic!("{e}")),
            read_only,
        }
        .to_string();
        assert_eq!(
            parse_bind_line(&line),
            Some((source.to_owned(), target.to_owned())),
            "{line:?}"
        );
    }
}

/// Machine names: an accepted name is safe as a path component and a unit-name part, and
/// prints back to itself.
pub fn machine_name(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(name) = text.parse::<MachineName>() {
        let s = name.as_str();
        assert_eq!(s, text);
        assert_eq!(name.to_string(), text);
        assert!((1..=64).contains(&s.len()), "{s:?}");
        assert!(
            !s.starts_with('.') && s != ".." && !s.contains('/'),
            "{s:?}"
        );
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-')),
            "{s:?}"
        );
        // systemd's hostname rules: dot-separated labels, none empty, none starting or ending
        // with '-'.
        assert!(
            s.split('.')
                .all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-')),
            "{s:?}"
        );
    }
}
