//! The C runtime of the driver's tools: the host files the dynamic loader needs to run
//! `nvidia-smi` and the other driver binaries inside the driver root, as NVIDIA's GPU Operator
//! validator and MIG manager run them (`chroot <driver root> nvidia-smi`).
//!
//! Read from the ELF files themselves: each driver binary's loader (`PT_INTERP`) and needed
//! libraries (`DT_NEEDED`), the needs of the libraries the tools load at run time (NVML for
//! `nvidia-smi`, libcuda for the MPS server), and so on transitively. A needed library the
//! driver provides is already in the tree; any other is looked up on the host in the
//! directories the loader searches without a cache for that architecture, and must be an ELF
//! object of the binary's class and machine. Nothing comes from a machine's rootfs. A need that
//! cannot be met is a warning, not a failure: containers get the driver from the CDI spec, not
//! from the driver root's loader; only a chroot into the driver root would fail.

use super::parse::{self, ElfDeps};
use super::scan::Scan;
use super::{RuntimeFile, UserspaceDriver};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Most files the runtime may hold (Debian 12's `nvidia-smi` needs 6, `nvidia-persistenced` 9).
pub const MAX_RUNTIME_FILES: usize = 64;

/// Driver libraries (name prefixes) whose needs count besides the binaries': what the tools
/// load at run time.
const LOADED_AT_RUN_TIME: &[&str] = &["libnvidia-ml.so.", "libcuda.so."];

/// Where the loader looks for a library of `triplet` when no cache names it: Debian's multiarch
/// directories, then the lib64 and plain ones.
fn search_dirs(triplet: &str) -> Vec<String> {
    let mut dirs = vec![format!("/lib/{triplet}"), format!("/usr/lib/{triplet}")];
    if triplet != "i386-linux-gnu" {
        dirs.extend(["/lib64".to_owned(), "/usr/lib64".to_owned()]);
    }
    dirs.extend(["/lib".to_owned(), "/usr/lib".to_owned()]);
    dirs
}

/// One library still to find: its name, the triplet, class and machine it must match, and who
/// needs it (for the log).
struct Need {
    name: String,
    want: parse::ElfInfo,
    by: String,
}

/// The runtime of `driver`'s binaries on the host (see the module doc), sorted by path in the
/// driver root: each loader at its `PT_INTERP` path, each library at `/usr/lib/<triplet>/<name>`.
pub(super) fn c_runtime(s: &Scan, driver: &UserspaceDriver) -> Result<Vec<RuntimeFile>> {
    let mut provided: BTreeSet<(String, String)> = BTreeSet::new();
    let mut queue: VecDeque<Need> = VecDeque::new();
    let mut out: BTreeMap<String, RuntimeFile> = BTreeMap::new();
    for dir in &driver.lib_dirs {
        for f in &dir.files {
            let name = f.name.rsplit('/').next().unwrap_or(&f.name);
            provided.insert((dir.triplet.clone(), name.to_owned()));
            if let Some(so) = &f.soname {
                provided.insert((dir.triplet.clone(), so.clone()));
            }
        }
    }
    for bin in &driver.binaries {
        let Some(deps) = read_deps(s, bin.as_str(), "driver binary")? else {
            continue;
        };
        if let Some(interp) = &deps.interp
            && !out.contains_key(interp)
        {
            match find(s, interp, &deps.info)? {
                Some((source, _)) => {
                    out.insert(interp.clone(), file(interp.clone(), source)?);
                }
                None => tracing::warn!(
                    "the loader {interp} of {bin} is not on the host (or not an ELF object for \
                     its machine): chroot into the driver root cannot run it"
                ),
            }
        }
        queue_needs(&mut queue, &deps, bin.as_str());
    }
    for dir in driver
        .lib_dirs
        .iter()
        .filter(|d| d.triplet != "i386-linux-gnu")
    {
        for f in &dir.files {
            if LOADED_AT_RUN_TIME.iter().any(|p| f.name.starts_with(p)) {
                let path = format!("{}/{}", dir.path, f.name);
                if let Some(deps) = read_deps(s, &path, "driver library")? {
                    queue_needs(&mut queue, &deps, &path);
                }
            }
        }
    }
    let mut seen = BTreeSet::new();
    while let Some(need) = queue.pop_front() {
        let Some(triplet) = need.want.triplet() else {
            continue;
        };
        let key = (triplet.to_owned(), need.name.clone());
        if provided.contains(&key) || !seen.insert(key) {
            continue;
        }
        if out.len() >= MAX_RUNTIME_FILES {
            tracing::warn!(
                "the driver's tools need more than {MAX_RUNTIME_FILES} C runtime files; {} \
                 (needed by {}) and the rest are left out of the driver root",
                need.name,
                need.by
            );
            break;
        }
        let found = search_dirs(triplet)
            .into_iter()
            .map(|d| format!("{d}/{}", need.name))
            .find_map(|p| find(s, &p, &need.want).transpose())
            .transpose()?;
        let Some((source, deps)) = found else {
            tracing::warn!(
                "{} (needed by {}) is not on the host for {triplet}: chroot into the driver \
                 root cannot run it",
                need.name,
                need.by
            );
            continue;
        };
        let path = format!("/usr/lib/{triplet}/{}", need.name);
        queue_needs(&mut queue, &deps, &path);
        out.insert(path.clone(), file(path, source)?);
    }
    Ok(out.into_values().collect())
}

fn file(path: String, source: String) -> Result<RuntimeFile> {
    Ok(RuntimeFile {
        path,
        source: super::scan::checked("C runtime file", source)?,
    })
}

fn queue_needs(queue: &mut VecDeque<Need>, deps: &ElfDeps, by: &str) {
    for name in &deps.needed {
        queue.push_back(Need {
            name: name.clone(),
            want: deps.info.clone(),
            by: by.to_owned(),
        });
    }
}

/// The loader's view of the host file `abs`: `None` (logged) when it is not an ELF object.
fn read_deps(s: &Scan, abs: &str, what: &str) -> Result<Option<ElfDeps>> {
    match s.elf_deps(abs)? {
        Ok(d) => Ok(Some(d)),
        Err(e) => {
            tracing::debug!(
                "{what} {abs} is not an ELF object the loader runs ({e}); its needs are not looked up"
            );
            Ok(None)
        }
    }
}

/// The canonical host path of `abs` and what the loader reads in it, when it resolves (inside
/// the host root) to a regular ELF file of `want`'s class, byte order and machine; `None`
/// otherwise. Each candidate is read once.
fn find(s: &Scan, abs: &str, want: &parse::ElfInfo) -> Result<Option<(String, ElfDeps)>> {
    let Some((canonical, meta)) = s.resolve(abs)? else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let deps = s.elf_deps(&canonical)?.ok().filter(|d| {
        (d.info.bits, d.info.big_endian, d.info.machine)
            == (want.bits, want.big_endian, want.machine)
    });
    Ok(deps.map(|d| (canonical, d)))
}
