//! Whether a target's `/etc/ld.so.cache` serves the driver: `ldconfig` runs when a library link
//! changed or when it does not.

use super::links::open_dir_if_dir;
use crate::discovery::UserspaceDriver;
use crate::fs::machine_root::MachineRoot;
use anyhow::Result;
use std::collections::HashSet;

/// The dynamic linker cache, which `ldconfig` writes.
const LD_CACHE: (&str, &str) = ("/etc", "ld.so.cache");
/// Largest `ld.so.cache` read.
const MAX_LD_CACHE_BYTES: usize = 64 << 20;

/// Whether the root's `/etc/ld.so.cache` lists every driver library of each multiarch dir the
/// root has, under the name `ldconfig` gives it (its SONAME, else its file name), at that dir.
/// A cache written while the links dangled (say an `ldconfig` at boot, before the driver root
/// existed) lacks those entries, so `ldconfig` runs. `vdpau/` is not in the cache (`ldconfig`
/// does not scan it) and not checked. A root with none of the driver's multiarch dirs has no
/// library link of ours for the cache to list: nothing is missing. No cache, or one of an
/// unknown format, lists nothing.
pub fn lists_driver(root: &MachineRoot, driver: &UserspaceDriver) -> Result<bool> {
    let mut wanted = Vec::new();
    for dir in &driver.lib_dirs {
        // The links go to /usr/lib/<triplet> only when the root has it (see links::each_lib_dir).
        if open_dir_if_dir(root, &format!("/usr/lib/{}", dir.triplet))?.is_none() {
            continue;
        }
        for f in dir.files.iter().filter(|f| !f.name.contains('/')) {
            let name = f.soname.as_deref().unwrap_or(&f.name);
            wanted.push(format!("/lib/{}/{name}", dir.triplet));
        }
    }
    if wanted.is_empty() {
        return Ok(true);
    }
    let Some(etc) = open_dir_if_dir(root, LD_CACHE.0)? else {
        return Ok(false);
    };
    let Some(cache) = etc.read_regular(LD_CACHE.1, MAX_LD_CACHE_BYTES)? else {
        return Ok(false);
    };
    Ok(lists(&cache, &wanted))
}

/// Why `ldconfig` must run in a target, or `None` when it need not: the one decision `status`,
/// `plan` and post-start share. `library_links_change`: a library link of ours changes (is
/// pending, or was just made). `lists`: [`lists_driver`]'s answer; a cache that cannot be read
/// is no reason to fail, `ldconfig` writes a new one.
pub(crate) fn ldconfig_needed(library_links_change: bool, lists: &Result<bool>) -> Option<String> {
    match (library_links_change, lists) {
        (true, _) => Some("library links change".to_owned()),
        (false, Ok(true)) => None,
        (false, Ok(false)) => {
            Some("/etc/ld.so.cache does not list the driver's libraries".to_owned())
        }
        (false, Err(e)) => Some(format!("/etc/ld.so.cache cannot be read ({e:#})")),
    }
}

/// Whether `cache` (the bytes of an `ld.so.cache`) has an entry for every path in `wanted`
/// (`/lib/<triplet>/<name>`), written `/lib/…` or `/usr/lib/…` (one dir under usrmerge). Read
/// with the one reader of the format ([`crate::discovery::ldcache::each`]); a cache it cannot read lists
/// nothing, which costs an `ldconfig` run, never a stale cache.
fn lists(cache: &[u8], wanted: &[String]) -> bool {
    let mut have: HashSet<&str> = HashSet::new();
    let read = crate::discovery::ldcache::each(cache, |e| {
        have.insert(match e.path.strip_prefix("/usr") {
            Some(rest) if rest.starts_with("/lib/") => rest,
            _ => e.path,
        });
    });
    read.is_ok() && wanted.iter().all(|w| have.contains(w.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ld_cache_must_list_every_path_whole() {
        use crate::discovery::ldcache::{Entry, render};
        let cache = render(&[
            Entry::new(
                0x303,
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            ),
            Entry::new(
                0x303,
                "libnvidia-ml.so.1",
                "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ),
            Entry::new(
                0x303,
                "libEGL_nvidia.so.0",
                "/usr/local/lib/x86_64-linux-gnu/libEGL_nvidia.so.0",
            ),
            // A key whose path is in another directory is no entry of the wanted one.
            Entry::new(0x303, "libGLX_nvidia.so.0", "/opt/libGLX_nvidia.so.0"),
        ]);
        let want = |names: &[&str]| -> Vec<String> {
            names
                .iter()
                .map(|n| format!("/lib/x86_64-linux-gnu/{n}"))
                .collect()
        };
        assert!(lists(&cache, &want(&["libcuda.so.1", "libnvidia-ml.so.1"])));
        // Another dir's entry is not ours; a key without its path is no entry of that dir;
        // neither is an unknown format.
        assert!(!lists(&cache, &want(&["libEGL_nvidia.so.0"])));
        assert!(!lists(&cache, &want(&["libGLX_nvidia.so.0"])));
        assert!(!lists(&cache[1..], &want(&["libcuda.so.1"])));
    }
}
