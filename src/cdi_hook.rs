//! The OCI hooks our CDI spec names: `nspawn-lifecycle-helper cdi-hook <hook> …`, run by the
//! container runtime (runc, crun) inside the machine as `createContainer` hooks.
//!
//! A runtime runs a `createContainer` hook after it has set up the container's mounts (the CDI
//! binds included) in the container's mount namespace, before `pivot_root`, as root, and hands
//! it the OCI state on stdin: `bundle` → `<bundle>/config.json` → `root.path` is the container's
//! root as the runtime sees it. The image behind that root is untrusted, so:
//! - every path is resolved inside the container root with `openat2(RESOLVE_IN_ROOT)` from one
//!   descriptor of that root; an image symlink, absolute or `../..`, resolves inside the image,
//!   never on the machine;
//! - what we create or replace is addressed as (directory fd, one name) and never followed; the
//!   directories we write in must be on the root's own filesystem (`RESOLVE_NO_XDEV`), so an
//!   image symlink cannot steer a write into `/proc`, `/sys`, `/dev` or a volume;
//! - nothing from the image is ever executed: no `ldconfig`, no shell. The linker cache is
//!   written by [`crate::ldcache`] (see there for why), and image files are only read when they
//!   are regular files (`/etc/ld.so.cache`), never opened if they are FIFOs or devices.
//!
//! The root is a [`MachineRoot`] opened as a [`crate::machine_root::RootKind::Container`]: the
//! same descriptor walk the machine side uses, with `RESOLVE_NO_XDEV` on every directory.
//!
//! Hooks (CLI shape is stable; the CDI spec in [`crate::cdi`] writes these arguments):
//! - `create-symlinks --link TARGET::LINK …`: make LINK (a path in the container) a symlink to
//!   TARGET, replacing a stale symlink or file there; a directory there is an error.
//! - `update-ldcache --lib SONAME::PATH …`: add the libraries to the container's
//!   `/etc/ld.so.cache` (keeping the image's own entries) and name their directories in
//!   `/etc/ld.so.conf.d/` when the image has that directory, so an `ldconfig` run later in the
//!   container keeps them.
//! - `disable-device-node-modification [--host-params FILE]`: when the host has
//!   `/proc/driver/nvidia/params`, bind a read-only copy with `ModifyDeviceFiles: 0` over the
//!   container's, so the driver never creates device nodes in a container that has
//!   `CAP_MKNOD` (containerd grants it).

use crate::ldcache;
use crate::machine_root::{Lookup, MachineRoot, split_parent};
use anyhow::{Context as _, Result, bail};
use nix::sys::stat::SFlag;
use std::io::Read as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

/// The host's driver parameters, which the driver reads `ModifyDeviceFiles` from.
pub const HOST_PARAMS: &str = "/proc/driver/nvidia/params";
/// Where the container sees them (its `/proc`, mounted by the runtime before the hook runs).
const CONTAINER_PARAMS: &str = "/proc/driver/nvidia/params";
/// The conf file naming our library directories, read by a later `ldconfig` in the container.
const LD_CONF: &str = "/etc/ld.so.conf.d/000-nspawn-lifecycle-nvidia.conf";
const LD_CACHE: &str = "/etc/ld.so.cache";
/// The most of the OCI state and `config.json` we read (a real config is a few kilobytes).
const MAX_JSON: u64 = 4 << 20;

/// The OCI state a runtime passes a hook on stdin (only what we use).
#[derive(Debug, serde::Deserialize)]
struct State {
    bundle: PathBuf,
}

/// The one field of the bundle's `config.json` we use.
#[derive(Debug, serde::Deserialize)]
struct Config {
    root: Root,
}

#[derive(Debug, serde::Deserialize)]
struct Root {
    path: PathBuf,
}

/// The container root named by the OCI state in `state` (the hook's stdin): `root.path` of the
/// bundle's `config.json`, relative to the bundle unless absolute. A root that is the runtime's
/// own `/` is refused: every write would land outside any container.
pub fn root_from_state(state: impl std::io::Read) -> Result<PathBuf> {
    let mut text = String::new();
    state
        .take(MAX_JSON)
        .read_to_string(&mut text)
        .context("reading the OCI state on stdin")?;
    let state: State = serde_json::from_str(&text)
        .context("the OCI state on stdin is not JSON with a \"bundle\" string")?;
    let config_path = state.bundle.join("config.json");
    let mut text = String::new();
    std::fs::File::open(&config_path)
        .with_context(|| format!("opening {}", config_path.display()))?
        .take(MAX_JSON)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", config_path.display()))?;
    let config: Config = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} has no \"root\": {{\"path\": …}} string",
            config_path.display()
        )
    })?;
    let root = if config.root.path.is_absolute() {
        config.root.path
    } else {
        state.bundle.join(config.root.path)
    };
    Ok(root)
}

/// `TARGET::LINK` or `SONAME::PATH`, split at the first `::`.
pub fn split_pair(arg: &str) -> Result<(&str, &str)> {
    match arg.split_once("::") {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a, b)),
        _ => Err(crate::error::bad_input(format!(
            "{arg:?} is not of the form A::B"
        ))),
    }
}

/// `create-symlinks`: every `(target, link)`, in order; stops at the first error. Missing
/// parent directories are made (0755); a stale link or a file of the image at `link` is
/// replaced atomically, a directory there is an error.
pub fn create_symlinks(root: &MachineRoot, links: &[(&str, &str)]) -> Result<()> {
    for (target, link) in links {
        let outcome = symlink(root, target, link)
            .with_context(|| format!("container {}", root.origin().display()))?;
        tracing::debug!(link, target, ?outcome, "cdi-hook create-symlinks");
    }
    Ok(())
}

fn symlink(
    root: &MachineRoot,
    target: &str,
    link: &str,
) -> Result<crate::machine_root::LinkOutcome> {
    if target.is_empty() || target.contains('\0') {
        bail!("symlink target {target:?} for {link} is empty or holds NUL");
    }
    let (parent, name) = split_parent(link)?;
    root.create_dir_all(&parent, 0o755)?
        .symlink_over_file(name, target)
}

/// Atomically make `path` in the container a regular file with `bytes` and `mode`, making
/// missing parent directories (0755).
fn write_file(root: &MachineRoot, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
    let (parent, name) = split_parent(path)?;
    root.create_dir_all(&parent, 0o755)?
        .write_file_unnamed(name, bytes, mode)?;
    Ok(())
}

/// `update-ldcache`: the image's cache plus `libs` (`(soname, path)`), written back; the conf
/// entry when the image has `/etc/ld.so.conf.d`.
pub fn update_ldcache(root: &MachineRoot, libs: &[(&str, &str)]) -> Result<()> {
    for (soname, path) in libs {
        if soname.contains('/') || !path.starts_with('/') {
            return Err(crate::error::bad_input(format!(
                "--lib {soname}::{path}: want a SONAME and an absolute path"
            )));
        }
    }
    let ours: Vec<ldcache::Entry> = libs
        .iter()
        .map(|(s, p)| ldcache::Entry::new(ldcache::flags_for(p), s, p))
        .collect();
    let existing = match root.read_resolved(LD_CACHE, ldcache::MAX_CACHE)? {
        Some(bytes) => match ldcache::parse(&bytes) {
            Ok(e) => e,
            Err(e) => {
                // The loader ignores a cache it cannot read too, and searches its default
                // directories: replacing it with ours loses nothing the image had.
                tracing::warn!(
                    "the container's {LD_CACHE} is unreadable ({e:#}); writing a new one"
                );
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    let merged = ldcache::merge(existing, &ours);
    write_file(root, LD_CACHE, &ldcache::render(&merged), 0o644)
        .with_context(|| format!("container {}", root.origin().display()))?;
    // Directories of our libraries, for an `ldconfig` the container may run later.
    let mut dirs: Vec<&str> = Vec::new();
    for (_, p) in libs {
        let d = p.rsplit_once('/').map_or("/", |(d, _)| d);
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    // Only into a directory the image has, on the root's own filesystem (a lookup error is
    // "not there" here: the conf entry is a courtesy to a later ldconfig, not needed to load).
    let (conf_dir, conf_name) = split_parent(LD_CONF)?;
    if let Ok(Lookup::Dir(dir)) = root.lookup_dir(&conf_dir) {
        let mut text = String::from(
            "# Written by nspawn-lifecycle-helper cdi-hook update-ldcache: the host's NVIDIA driver.\n",
        );
        for d in dirs {
            text.push_str(d);
            text.push('\n');
        }
        dir.write_file_unnamed(conf_name, text.as_bytes(), 0o644)?;
    }
    Ok(())
}

/// `params` with every `ModifyDeviceFiles:` line set to 0.
pub fn params_without_device_modification(params: &str) -> String {
    let mut out = String::with_capacity(params.len());
    for line in params.lines() {
        if line.trim_start().starts_with("ModifyDeviceFiles:") {
            out.push_str("ModifyDeviceFiles: 0");
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// `disable-device-node-modification`: see the module doc. Nothing to do when the host file is
/// missing (no NVIDIA kernel driver) or the container has no such file to cover.
pub fn disable_device_node_modification(root: &MachineRoot, host_params: &Path) -> Result<()> {
    let params = match std::fs::read_to_string(host_params) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", host_params.display())),
    };
    let modified = params_without_device_modification(&params);
    // The target: resolved inside the root with no symlink anywhere (a real /proc has none),
    // pinned by an O_PATH descriptor that the bind goes onto.
    let Some(target) = root.pin_no_symlinks(CONTAINER_PARAMS)? else {
        tracing::info!("{CONTAINER_PARAMS} does not exist in the container; nothing to cover");
        return Ok(());
    };
    let st = nix::sys::stat::fstat(&target).context("stat the container's params")?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        bail!("{CONTAINER_PARAMS} in the container is not a regular file");
    }
    // The copy lives on a private tmpfs mounted only in this (the container's) mount namespace;
    // once bound, the tmpfs is detached and its directory removed: nothing stays behind.
    let tmp = tempfile::Builder::new()
        .prefix("nspawn-lifecycle-params.")
        .tempdir()
        .context("creating a temporary directory for the params copy")?;
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    mount(
        Some("tmpfs"),
        tmp.path(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=64k,mode=0700"),
    )
    .with_context(|| format!("mounting a tmpfs on {}", tmp.path().display()))?;
    let result = (|| -> Result<()> {
        let copy = tmp.path().join("params");
        std::fs::write(&copy, modified.as_bytes())
            .with_context(|| format!("writing {}", copy.display()))?;
        // Read-only before the bind: a bind mount takes its source mount's flags, so the copy
        // is never writable in the container, and nothing is remounted through a path that
        // could name the container's procfs instead.
        mount(
            None::<&str>,
            tmp.path(),
            None::<&str>,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
            Some("size=64k,mode=0700"),
        )
        .with_context(|| format!("making {} read-only", tmp.path().display()))?;
        let onto = format!("/proc/self/fd/{}", target.as_raw_fd());
        mount(
            Some(&copy),
            onto.as_str(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .with_context(|| format!("binding the params copy over {CONTAINER_PARAMS}"))
    })();
    let _ = umount2(tmp.path(), MntFlags::MNT_DETACH);
    result
}

/// Run one hook for the container the OCI state in `state` names.
pub fn run(hook: &crate::cli::CdiHook, state: impl std::io::Read) -> Result<()> {
    use crate::cli::CdiHook;
    let pairs = |args: &[String]| -> Result<Vec<(String, String)>> {
        args.iter()
            .map(|a| split_pair(a).map(|(x, y)| (x.to_owned(), y.to_owned())))
            .collect()
    };
    // Arguments are checked before anything is opened: a bad spec writes nothing.
    let args = match hook {
        CdiHook::CreateSymlinks { links } => pairs(links)?,
        CdiHook::UpdateLdcache { libs } => pairs(libs)?,
        CdiHook::DisableDeviceNodeModification { .. } => Vec::new(),
    };
    let args: Vec<(&str, &str)> = args.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let root = MachineRoot::open_container(&root_from_state(state)?)?;
    match hook {
        CdiHook::CreateSymlinks { .. } => create_symlinks(&root, &args),
        CdiHook::UpdateLdcache { .. } => update_ldcache(&root, &args),
        CdiHook::DisableDeviceNodeModification { host_params } => {
            disable_device_node_modification(&root, host_params)
        }
    }
}
