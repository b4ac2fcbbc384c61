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
//!   written by [`crate::discovery::ldcache`] (see there for why), and image files are only read when they
//!   are regular files (`/etc/ld.so.cache`), never opened if they are FIFOs or devices.
//!
//! The root is a [`MachineRoot`] opened as a [`crate::fs::machine_root::RootKind::Container`]: the
//! same descriptor walk the machine side uses, with `RESOLVE_NO_XDEV` on every directory.
//!
//! Hooks (CLI shape is stable; the CDI spec in [`crate::model::cdi`] writes these arguments):
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

use crate::discovery::ldcache;
use crate::fs::fd_mount;
use crate::fs::machine_root::{ImageFile, Lookup, MachineRoot, split_parent};
use anyhow::{Context as _, Result, bail};
use nix::sys::stat::SFlag;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::types::hook::CdiHook;
pub use crate::types::hook::HOST_PARAMS;
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
pub(crate) fn root_from_state(state: impl std::io::Read) -> Result<PathBuf> {
    let mut text = String::new();
    state
        .take(MAX_JSON)
        .read_to_string(&mut text)
        .context("reading the OCI state on stdin")?;
    let state: State = serde_json::from_str(&text)
        .context("the OCI state on stdin is not JSON with a \"bundle\" string")?;
    if !state.bundle.is_absolute() {
        // Relative to what? Our working directory is `/`, never the runtime's.
        return Err(crate::error::bad_input(format!(
            "the OCI state's bundle {} is not an absolute path",
            state.bundle.display()
        )));
    }
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
pub(crate) fn split_pair(arg: &str) -> Result<(&str, &str)> {
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
pub(crate) fn create_symlinks(root: &MachineRoot, links: &[(&str, &str)]) -> Result<()> {
    step(Step::Links);
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
) -> Result<crate::fs::machine_root::LinkOutcome> {
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
pub(crate) fn update_ldcache(root: &MachineRoot, libs: &[(&str, &str)]) -> Result<()> {
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
    step(Step::ReadCache);
    let existing = match root.read_image_file(LD_CACHE, ldcache::MAX_CACHE)? {
        ImageFile::Bytes(bytes) => match ldcache::parse(&bytes) {
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
        ImageFile::Unusable(why) => {
            tracing::warn!("the container's {LD_CACHE} is not read ({why}); writing a new one");
            Vec::new()
        }
        ImageFile::Absent => Vec::new(),
    };
    step(Step::WriteCache);
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
    step(Step::WriteConf);
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
pub(crate) fn params_without_device_modification(params: &str) -> String {
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

/// The most of the host's params file we read (a real one is under 1 KiB).
const MAX_PARAMS: u64 = 64 << 10;

/// `disable-device-node-modification`: see the module doc. Nothing to do when the host file is
/// missing (no NVIDIA kernel driver) or the container has no such file to cover.
///
/// The copy is made without naming a single path: a tmpfs attached nowhere, the file created
/// through its mount descriptor, sealed read-only, and its clone attached onto the pinned
/// target by descriptor ([`crate::fs::fd_mount`]). No scratch directory exists for a pod to swap.
pub(crate) fn disable_device_node_modification(
    root: &MachineRoot,
    host_params: &Path,
) -> Result<()> {
    step(Step::HostParams);
    // The machine's own procfs (this process has not pivoted into the container): nothing of
    // the container's is on this path.
    let params = match std::fs::File::open(host_params) {
        Ok(f) => {
            let mut text = String::new();
            f.take(MAX_PARAMS)
                .read_to_string(&mut text)
                .with_context(|| format!("reading {}", host_params.display()))?;
            text
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", host_params.display())),
    };
    let modified = params_without_device_modification(&params);
    // The target: resolved inside the root with no symlink anywhere (a real /proc has none),
    // pinned by an O_PATH descriptor that the bind goes onto.
    step(Step::PinParams);
    let Some(target) = root.pin_no_symlinks(CONTAINER_PARAMS)? else {
        tracing::info!("{CONTAINER_PARAMS} does not exist in the container; nothing to cover");
        return Ok(());
    };
    let st = nix::sys::stat::fstat(&target).context("stat the container's params")?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        bail!("{CONTAINER_PARAMS} in the container is not a regular file");
    }
    step(Step::CopyParams);
    let tmpfs = fd_mount::Tmpfs::new(c"64k")?;
    tmpfs.create_file(c"params", modified.as_bytes(), 0o444)?;
    tmpfs.seal()?;
    step(Step::BindParams);
    tmpfs
        .bind_file_onto(c"params", &target)
        .with_context(|| format!("binding the params copy over {CONTAINER_PARAMS}"))
}

/// Where a hook is, for the message of one that passes its [`DEADLINE_SECONDS`].
#[derive(Debug, Clone, Copy)]
enum Step {
    Start,
    State,
    Root,
    Links,
    ReadCache,
    WriteCache,
    WriteConf,
    HostParams,
    PinParams,
    CopyParams,
    BindParams,
}

impl Step {
    const ALL: [Step; 11] = [
        Step::Start,
        Step::State,
        Step::Root,
        Step::Links,
        Step::ReadCache,
        Step::WriteCache,
        Step::WriteConf,
        Step::HostParams,
        Step::PinParams,
        Step::CopyParams,
        Step::BindParams,
    ];

    /// The whole line a hook past its deadline prints (fixed bytes: the signal handler only
    /// writes them).
    fn deadline_line(self) -> &'static [u8] {
        match self {
            Step::Start => b"error: cdi-hook: deadline passed while starting\n",
            Step::State => {
                b"error: cdi-hook: deadline passed while reading the OCI state and config.json\n"
            }
            Step::Root => b"error: cdi-hook: deadline passed while opening the container root\n",
            Step::Links => b"error: cdi-hook create-symlinks: deadline passed while linking\n",
            Step::ReadCache => {
                b"error: cdi-hook update-ldcache: deadline passed while reading the container's /etc/ld.so.cache\n"
            }
            Step::WriteCache => {
                b"error: cdi-hook update-ldcache: deadline passed while writing the container's /etc/ld.so.cache\n"
            }
            Step::WriteConf => {
                b"error: cdi-hook update-ldcache: deadline passed while writing the container's /etc/ld.so.conf.d entry\n"
            }
            Step::HostParams => {
                b"error: cdi-hook disable-device-node-modification: deadline passed while reading the host's params\n"
            }
            Step::PinParams => {
                b"error: cdi-hook disable-device-node-modification: deadline passed while opening the container's /proc/driver/nvidia/params\n"
            }
            Step::CopyParams => {
                b"error: cdi-hook disable-device-node-modification: deadline passed while writing the params copy\n"
            }
            Step::BindParams => {
                b"error: cdi-hook disable-device-node-modification: deadline passed while binding the params copy\n"
            }
        }
    }
}

/// How long a hook may take in all. A hook runs in every GPU container's start and takes a few
/// milliseconds; a runtime waits for it without a bound of its own (runc ignores SIGTERM while
/// it waits), so a hook stuck on something the image planted would hang the pod's start. Past
/// this, the hook prints the step it was in and exits 1: that container fails, nothing else.
pub const DEADLINE_SECONDS: u32 = 10;

static STEP: AtomicUsize = AtomicUsize::new(0);

fn step(s: Step) {
    STEP.store(s as usize, Ordering::SeqCst);
}

extern "C" fn on_deadline(_: libc::c_int) {
    let i = STEP.load(Ordering::SeqCst);
    let line = Step::ALL
        .get(i)
        .copied()
        .unwrap_or(Step::Start)
        .deadline_line();
    // Only async-signal-safe calls: write(2) and _exit(2).
    let _ = nix::unistd::write(std::io::stderr(), line);
    #[allow(unsafe_code)]
    // SAFETY: _exit ends the process at once; nothing of ours needs to run after a deadline.
    unsafe {
        libc::_exit(1)
    };
}

/// Make this process a hook's: run first thing in `main`, before logging or anything else reads
/// the environment or the working directory. The runtime starts a hook with the container's
/// environment (its image's `ENV`, the pod's) and the container's rootfs as working directory;
/// a hook takes nothing from either: the environment is emptied, the working directory is `/`,
/// the umask is 022, and the [`DEADLINE_SECONDS`] alarm is armed.
pub fn isolate_process() -> Result<()> {
    let names: Vec<_> = std::env::vars_os().map(|(k, _)| k).collect();
    for name in names {
        #[allow(unsafe_code)]
        // SAFETY: called first thing in `main`, while the process has one thread and nothing
        // else reads or writes the environment.
        unsafe {
            std::env::remove_var(name)
        };
    }
    nix::unistd::chdir("/").context("chdir /")?;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_deadline),
        SaFlags::empty(),
        SigSet::empty(),
    );
    #[allow(unsafe_code)]
    // SAFETY: the handler only calls async-signal-safe functions (write, _exit) and reads an
    // atomic.
    unsafe { sigaction(Signal::SIGALRM, &action) }.context("installing the deadline handler")?;
    nix::unistd::alarm::set(DEADLINE_SECONDS);
    Ok(())
}

/// Run one hook for the container the OCI state in `state` names.
pub fn run(hook: &CdiHook, state: impl std::io::Read) -> Result<()> {
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
    step(Step::State);
    let root_path = root_from_state(state)?;
    step(Step::Root);
    let root = MachineRoot::open_container(&root_path)?;
    match hook {
        CdiHook::CreateSymlinks { .. } => create_symlinks(&root, &args),
        CdiHook::UpdateLdcache { .. } => update_ldcache(&root, &args),
        CdiHook::DisableDeviceNodeModification { testkit } => {
            disable_device_node_modification(&root, testkit.host_params())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_found_by_its_index() {
        for (i, s) in Step::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
            let line = s.deadline_line();
            assert!(line.starts_with(b"error: cdi-hook") && line.ends_with(b"\n"));
        }
    }
}
