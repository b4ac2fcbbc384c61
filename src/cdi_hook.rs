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
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
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

/// The container's root directory, opened once, as the runtime set it up.
#[derive(Debug)]
pub struct ContainerRoot {
    fd: OwnedFd,
    path: PathBuf,
}

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

fn in_root() -> ResolveFlag {
    ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// Resolution for directories we write in: inside the root, and never onto another mount.
fn in_root_same_fs() -> ResolveFlag {
    in_root() | ResolveFlag::RESOLVE_NO_XDEV
}

fn beneath_no_symlinks() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// `openat2`, retried on `EAGAIN` (a rename or mount elsewhere raced with resolving `..`).
fn openat2(dirfd: &OwnedFd, path: &str, how: OpenHow) -> nix::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match nix::fcntl::openat2(dirfd, path, how) {
            Err(Errno::EAGAIN) if tries < 64 => tries += 1,
            r => return r,
        }
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

/// The components of an absolute container path; `.`, `..` and empty names are refused (our
/// own arguments never need them).
fn components(path: &str) -> Result<Vec<&str>> {
    let Some(rest) = path.strip_prefix('/') else {
        bail!("{path:?} is not an absolute path in the container");
    };
    let comps: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    if comps.is_empty() {
        bail!("{path:?} is the container root, not a file in it");
    }
    for c in &comps {
        if *c == "." || *c == ".." || c.contains('\0') {
            bail!("{path:?}: {c:?} is not a plain file name");
        }
    }
    Ok(comps)
}

/// A directory inside the container, held open.
struct Dir {
    fd: OwnedFd,
    path: String,
}

impl Dir {
    fn child(&self, name: &str) -> String {
        if self.path == "/" {
            format!("/{name}")
        } else {
            format!("{}/{name}", self.path)
        }
    }

    fn lstat(&self, name: &str) -> Result<Option<FileStat>> {
        match nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("stat {} in the container", self.child(name))),
        }
    }

    /// Replace `name` with what `create` makes under the temporary name, atomically.
    fn replace(&self, name: &str, create: impl FnOnce(&str) -> Result<()>) -> Result<()> {
        let tmp = format!(".{name}.nspawn-lifecycle.tmp");
        let _ = nix::unistd::unlinkat(
            &self.fd,
            tmp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        create(&tmp)?;
        if let Err(e) = nix::fcntl::renameat(&self.fd, tmp.as_str(), &self.fd, name) {
            let _ = nix::unistd::unlinkat(
                &self.fd,
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(e)
                .with_context(|| format!("replacing {} in the container", self.child(name)));
        }
        Ok(())
    }
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR
}

/// What [`ContainerRoot::symlink`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linked {
    Unchanged,
    Created,
    /// A stale symlink or a file of the image was atomically replaced.
    Replaced,
}

impl ContainerRoot {
    /// Open the container root at `path` (from the runtime, trusted; may itself be a symlink).
    pub fn open(path: &Path) -> Result<ContainerRoot> {
        let fd = nix::fcntl::open(path, dir_flags(), Mode::empty())
            .with_context(|| format!("opening container root {}", path.display()))?;
        let ours = nix::sys::stat::fstat(&fd).context("stat container root")?;
        let slash = nix::sys::stat::stat("/").context("stat /")?;
        if (ours.st_dev, ours.st_ino) == (slash.st_dev, slash.st_ino) {
            bail!(
                "container root {} is the runtime's own root directory; refusing to write there",
                path.display()
            );
        }
        Ok(ContainerRoot {
            fd,
            path: path.to_path_buf(),
        })
    }

    fn root_dir(&self) -> Result<Dir> {
        Ok(Dir {
            fd: nix::unistd::dup(&self.fd).context("duplicating the container root fd")?,
            path: "/".into(),
        })
    }

    /// The parent directory of `path` and its last name, creating missing directories (0755),
    /// resolving existing ones inside the root and on the root's filesystem only.
    fn parent_of<'p>(&self, path: &'p str) -> Result<(Dir, &'p str)> {
        let comps = components(path)?;
        let (name, parents) = comps.split_last().expect("components are never empty");
        let mut cur = self.root_dir()?;
        for (i, c) in parents.iter().enumerate() {
            let prefix = format!("/{}", parents[..=i].join("/"));
            let how = OpenHow::new().flags(dir_flags()).resolve(in_root_same_fs());
            cur = match openat2(&self.fd, &prefix, how) {
                Ok(fd) => Dir { fd, path: prefix },
                Err(Errno::ENOENT) => {
                    if cur.lstat(c)?.is_some() {
                        bail!("{prefix} in the container is a dangling symlink or not a directory");
                    }
                    match nix::sys::stat::mkdirat(&cur.fd, *c, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => {
                            return Err(e)
                                .with_context(|| format!("creating {prefix} in the container"));
                        }
                    }
                    let how = OpenHow::new()
                        .flags(dir_flags() | OFlag::O_NOFOLLOW)
                        .resolve(beneath_no_symlinks() | ResolveFlag::RESOLVE_NO_XDEV);
                    let fd = openat2(&cur.fd, c, how)
                        .with_context(|| format!("opening {prefix} in the container"))?;
                    Dir { fd, path: prefix }
                }
                Err(Errno::EXDEV) => bail!(
                    "{prefix} in the container is on another filesystem than the container \
                     root (a mount, or an image symlink into one); refusing to write there"
                ),
                Err(Errno::ENOTDIR) => {
                    bail!("{prefix} in the container is not a directory")
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("opening {prefix} in the container"));
                }
            };
        }
        Ok((cur, name))
    }

    /// Make `link` a symlink to `target`; see the module doc for what is replaced.
    pub fn symlink(&self, target: &str, link: &str) -> Result<Linked> {
        if target.is_empty() || target.contains('\0') {
            bail!("symlink target {target:?} for {link} is empty or holds NUL");
        }
        let (dir, name) = self.parent_of(link)?;
        let outcome = match dir.lstat(name)? {
            None => Linked::Created,
            Some(st) if is_dir(&st) => bail!(
                "{link} in the container is a directory; not replacing it with a symlink to {target}"
            ),
            Some(st) => {
                let is_link =
                    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK;
                if is_link
                    && nix::fcntl::readlinkat(&dir.fd, name)
                        .is_ok_and(|t| t.as_encoded_bytes() == target.as_bytes())
                {
                    return Ok(Linked::Unchanged);
                }
                Linked::Replaced
            }
        };
        if outcome == Linked::Created {
            match nix::unistd::symlinkat(target, &dir.fd, name) {
                Ok(()) => return Ok(outcome),
                Err(Errno::EEXIST) => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("creating symlink {link} in the container"));
                }
            }
        }
        dir.replace(name, |tmp| {
            nix::unistd::symlinkat(target, &dir.fd, tmp)
                .with_context(|| format!("creating symlink {} in the container", dir.child(tmp)))
        })?;
        Ok(Linked::Replaced)
    }

    /// Atomically make `path` a regular file with `bytes` and `mode` (temp file + rename).
    pub fn write_file(&self, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
        let (dir, name) = self.parent_of(path)?;
        if let Some(st) = dir.lstat(name)?
            && is_dir(&st)
        {
            bail!("{path} in the container is a directory where a file is expected");
        }
        dir.replace(name, |tmp| {
            let how = OpenHow::new()
                .flags(
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                )
                .mode(Mode::from_bits_truncate(0o600))
                .resolve(beneath_no_symlinks());
            let fd = openat2(&dir.fd, tmp, how)
                .with_context(|| format!("creating {} in the container", dir.child(tmp)))?;
            nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode)).context("fchmod")?;
            let mut f = std::fs::File::from(fd);
            f.write_all(bytes)
                .and_then(|()| f.sync_all())
                .with_context(|| format!("writing {path} in the container"))
        })
    }

    /// The bytes of the regular file at `path` (symlinks followed inside the root), at most
    /// `max`; `None` when missing or not a regular file. A FIFO or device is never opened: an
    /// `O_PATH` descriptor is checked first and only that inode is reopened.
    pub fn read_regular(&self, path: &str, max: usize) -> Result<Option<Vec<u8>>> {
        components(path)?;
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(in_root());
        let pinned = match openat2(&self.fd, path, how) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("opening {path} in the container")),
        };
        let st = nix::sys::stat::fstat(&pinned).with_context(|| format!("stat {path}"))?;
        if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
            return Ok(None);
        }
        let fd = nix::fcntl::open(
            format!("/proc/self/fd/{}", pinned.as_raw_fd()).as_str(),
            OFlag::O_RDONLY | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("reopening {path} in the container for reading"))?;
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1))
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {path} in the container"))?;
        if bytes.len() > max {
            bail!("{path} in the container is larger than {max} bytes");
        }
        Ok(Some(bytes))
    }

    /// The host path of the root, for messages.
    pub fn origin(&self) -> &Path {
        &self.path
    }
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

/// `create-symlinks`: every `(target, link)`, in order; stops at the first error.
pub fn create_symlinks(root: &ContainerRoot, links: &[(&str, &str)]) -> Result<()> {
    for (target, link) in links {
        let outcome = root
            .symlink(target, link)
            .with_context(|| format!("container {}", root.origin().display()))?;
        tracing::debug!(link, target, ?outcome, "cdi-hook create-symlinks");
    }
    Ok(())
}

/// `update-ldcache`: the image's cache plus `libs` (`(soname, path)`), written back; the conf
/// entry when the image has `/etc/ld.so.conf.d`.
pub fn update_ldcache(root: &ContainerRoot, libs: &[(&str, &str)]) -> Result<()> {
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
    let existing = match root.read_regular(LD_CACHE, ldcache::MAX_CACHE)? {
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
    root.write_file(LD_CACHE, &ldcache::render(&merged), 0o644)
        .with_context(|| format!("container {}", root.origin().display()))?;
    // Directories of our libraries, for an `ldconfig` the container may run later.
    let mut dirs: Vec<&str> = Vec::new();
    for (_, p) in libs {
        let d = p.rsplit_once('/').map_or("/", |(d, _)| d);
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    let conf_dir = LD_CONF.rsplit_once('/').map_or("/", |(d, _)| d);
    let how = OpenHow::new().flags(dir_flags()).resolve(in_root_same_fs());
    if openat2(&root.fd, conf_dir, how).is_ok() {
        let mut text = String::from(
            "# Written by nspawn-lifecycle-helper cdi-hook update-ldcache: the host's NVIDIA driver.\n",
        );
        for d in dirs {
            text.push_str(d);
            text.push('\n');
        }
        root.write_file(LD_CONF, text.as_bytes(), 0o644)?;
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
pub fn disable_device_node_modification(root: &ContainerRoot, host_params: &Path) -> Result<()> {
    let params = match std::fs::read_to_string(host_params) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", host_params.display())),
    };
    let modified = params_without_device_modification(&params);
    // The target: resolved inside the root with no symlink anywhere (a real /proc has none),
    // pinned by an O_PATH descriptor that the bind goes onto.
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(in_root() | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let target = match openat2(&root.fd, CONTAINER_PARAMS, how) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => {
            tracing::info!("{CONTAINER_PARAMS} does not exist in the container; nothing to cover");
            return Ok(());
        }
        Err(e) => {
            return Err(e).with_context(|| format!("opening {CONTAINER_PARAMS} in the container"));
        }
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
    let root = ContainerRoot::open(&root_from_state(state)?)?;
    match hook {
        CdiHook::CreateSymlinks { .. } => create_symlinks(&root, &args),
        CdiHook::UpdateLdcache { .. } => update_ldcache(&root, &args),
        CdiHook::DisableDeviceNodeModification { host_params } => {
            disable_device_node_modification(&root, host_params)
        }
    }
}
