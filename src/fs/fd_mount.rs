//! Mounts made and attached by descriptor only, never by a path: the kernel's mount API
//! (`fsopen`/`fsconfig`/`fsmount`, `open_tree`, `move_mount`, `mount_setattr`; Linux 5.12).
//!
//! The CDI hooks run in a container's mount namespace before `pivot_root`, where every path
//! below the container root — and, through its working directory and environment, more — is the
//! pod's to change at any moment. A file they bind over a target must therefore come from a
//! place nobody else can see or name: a tmpfs that is attached nowhere ([`Tmpfs::new`]), written
//! through its mount descriptor, sealed read-only, and attached onto a target the caller pinned
//! with an `O_PATH` descriptor ([`Tmpfs::bind_file_onto`]). No directory is created, no path is
//! resolved in a tree the container can reach, nothing stays behind when the hook exits.

use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::ffi::CStr;
use std::io::Write as _;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

/// A tmpfs attached to no mount point, known only by its mount descriptor.
#[derive(Debug)]
pub struct Tmpfs {
    mnt: OwnedFd,
}

/// A syscall's raw return value as a descriptor.
#[allow(unsafe_code)]
fn fd_result(ret: libc::c_long) -> nix::Result<OwnedFd> {
    if ret < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(ret).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn unit_result(ret: libc::c_long) -> nix::Result<()> {
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
}

#[allow(unsafe_code)]
fn fsopen(fs: &CStr) -> nix::Result<OwnedFd> {
    // SAFETY: a valid NUL-terminated string and flags; the result is checked.
    fd_result(unsafe { libc::syscall(libc::SYS_fsopen, fs.as_ptr(), libc::FSOPEN_CLOEXEC) })
}

#[allow(unsafe_code)]
fn fsconfig_string(fs: &OwnedFd, key: &CStr, value: &CStr) -> nix::Result<()> {
    // SAFETY: a descriptor we own and valid NUL-terminated strings; the result is checked.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            libc::FSCONFIG_SET_STRING,
            key.as_ptr(),
            value.as_ptr(),
            0,
        )
    })
}

#[allow(unsafe_code)]
fn fsconfig_create(fs: &OwnedFd) -> nix::Result<()> {
    // SAFETY: a descriptor we own; no pointers; the result is checked.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })
}

#[allow(unsafe_code)]
fn fsmount(fs: &OwnedFd, attrs: u64) -> nix::Result<OwnedFd> {
    // SAFETY: a descriptor we own and plain flags; the result is checked.
    fd_result(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attrs,
        )
    })
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH | flags, {set, propagation})`.
#[allow(unsafe_code)]
fn mount_setattr(
    fd: RawFd,
    path: &CStr,
    flags: u32,
    set: u64,
    propagation: u64,
) -> nix::Result<()> {
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: 0,
        propagation,
        userns_fd: 0,
    };
    // SAFETY: a valid string and a fully initialised `mount_attr` whose size we pass; the
    // result is checked.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            path.as_ptr(),
            flags,
            std::ptr::from_ref(&attr),
            std::mem::size_of::<libc::mount_attr>(),
        )
    })
}

#[allow(unsafe_code)]
fn open_tree(dir: RawFd, name: &CStr, flags: u32) -> nix::Result<OwnedFd> {
    // SAFETY: a valid NUL-terminated string and flags; the result is checked.
    fd_result(unsafe { libc::syscall(libc::SYS_open_tree, dir, name.as_ptr(), flags) })
}

#[allow(unsafe_code)]
fn move_mount(
    from: RawFd,
    from_path: &CStr,
    to: RawFd,
    to_path: &CStr,
    flags: u32,
) -> nix::Result<()> {
    // SAFETY: valid NUL-terminated strings and flags; the result is checked.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            from_path.as_ptr(),
            to,
            to_path.as_ptr(),
            flags,
        )
    })
}

const EMPTY: &CStr = c"";

impl Tmpfs {
    /// A new tmpfs of at most `size` (tmpfs syntax, `64k`), root directory mode 0700, `nosuid`,
    /// `nodev`, `noexec`, attached nowhere.
    pub fn new(size: &CStr) -> Result<Tmpfs> {
        let fs = fsopen(c"tmpfs").context("fsopen(tmpfs)")?;
        fsconfig_string(&fs, c"size", size).context("fsconfig(tmpfs, size)")?;
        fsconfig_string(&fs, c"mode", c"0700").context("fsconfig(tmpfs, mode)")?;
        fsconfig_create(&fs).context("fsconfig(tmpfs, create)")?;
        let mnt = fsmount(
            &fs,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC,
        )
        .context("fsmount(tmpfs)")?;
        Ok(Tmpfs { mnt })
    }

    /// Create the regular file `name` in the tmpfs's root with `bytes` and `mode`, through the
    /// mount descriptor (nobody else can see this tmpfs, so nothing can be in the way).
    pub fn create_file(&self, name: &CStr, bytes: &[u8], mode: u32) -> Result<()> {
        let fd = nix::fcntl::openat(
            &self.mnt,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .with_context(|| format!("creating {name:?} on a private tmpfs"))?;
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode))
            .with_context(|| format!("chmod {name:?} on a private tmpfs"))?;
        std::fs::File::from(fd)
            .write_all(bytes)
            .with_context(|| format!("writing {name:?} on a private tmpfs"))?;
        Ok(())
    }

    /// Make the whole tmpfs read-only: every bind of it taken afterwards is read-only too.
    pub fn seal(&self) -> Result<()> {
        mount_setattr(
            self.mnt.as_raw_fd(),
            EMPTY,
            libc::AT_EMPTY_PATH as u32,
            libc::MOUNT_ATTR_RDONLY,
            0,
        )
        .context("making the private tmpfs read-only (mount_setattr)")
    }

    /// Bind the file `name` of this tmpfs onto the file `target` pins (an `O_PATH` descriptor
    /// in the caller's mount namespace), by descriptor: [`Tmpfs::clone_file`], then
    /// [`attach`].
    pub(crate) fn bind_file_onto(&self, name: &CStr, target: &OwnedFd) -> Result<()> {
        attach(&self.clone_file(name)?, target)
    }

    /// A detached mount of the file `name` alone (`open_tree(OPEN_TREE_CLONE)`).
    pub fn clone_file(&self, name: &CStr) -> Result<OwnedFd> {
        let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
        match open_tree(self.mnt.as_raw_fd(), name, flags) {
            Ok(fd) => Ok(fd),
            // Kernels before 6.15 clone only mounts of the caller's own namespace.
            Err(Errno::EINVAL) => self.clone_through_private_namespace(name),
            Err(e) => Err(e).with_context(|| format!("cloning {name:?} (open_tree)")),
        }
    }

    /// The clone of [`Tmpfs::clone_file`] where the kernel clones only mounts of the
    /// caller's namespace: in a private copy of our namespace (`unshare`), attach the tmpfs on
    /// its root, clone the file there, and return to the namespace we came from (`setns`). The
    /// copy, and the tmpfs's attachment in it, vanish with it; only the clone (detached) is
    /// kept. Needs a single-threaded process, which a hook is.
    pub fn clone_through_private_namespace(&self, name: &CStr) -> Result<OwnedFd> {
        use nix::sched::{CloneFlags, setns, unshare};
        let home = nix::fcntl::open(
            c"/proc/thread-self/ns/mnt",
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .context("opening our mount namespace")?;
        unshare(CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
        let cloned = (|| -> Result<OwnedFd> {
            // Private first: the copy's mounts are peers of shared originals, and the tmpfs
            // attached below must not propagate back into the namespace we came from.
            mount_setattr(
                libc::AT_FDCWD,
                c"/",
                libc::AT_RECURSIVE as u32,
                0,
                libc::MS_PRIVATE,
            )
            .context("making the private namespace's mounts private")?;
            move_mount(
                self.mnt.as_raw_fd(),
                EMPTY,
                libc::AT_FDCWD,
                c"/",
                libc::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .context("attaching the tmpfs in the private namespace (move_mount)")?;
            open_tree(
                self.mnt.as_raw_fd(),
                name,
                libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
            )
            .with_context(|| format!("cloning {name:?} (open_tree)"))
        })();
        // Whatever happened above, we must be back where we came from before going on: a
        // failure here leaves the process in the private copy, where the caller's target is not
        // reachable (move_mount fails), so it is an error, never silently ignored.
        if let Err(e) = setns(&home, CloneFlags::CLONE_NEWNS) {
            bail!("returning to our mount namespace (setns): {e}");
        }
        cloned
    }
}

/// Whether the directory `dir` is the root of a bpf filesystem.
pub(crate) fn is_bpffs(dir: &OwnedFd) -> Result<bool> {
    let st = nix::sys::statfs::fstatfs(dir).context("fstatfs")?;
    Ok(st.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// A new bpf filesystem (mode 0700, `nosuid`, `nodev`, `noexec`) attached onto the directory
/// `dir` pins.
pub(crate) fn mount_bpffs_onto(dir: &OwnedFd) -> Result<()> {
    let fs = fsopen(c"bpf").context("fsopen(bpf)")?;
    fsconfig_string(&fs, c"mode", c"0700").context("fsconfig(bpf, mode)")?;
    fsconfig_create(&fs).context("fsconfig(bpf, create)")?;
    let mnt = fsmount(
        &fs,
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC,
    )
    .context("fsmount(bpf)")?;
    attach(&mnt, dir)
}

/// Attach the detached mount `clone` onto the file or directory `target` pins (`move_mount`
/// from descriptor to descriptor).
pub fn attach(clone: &OwnedFd, target: &OwnedFd) -> Result<()> {
    move_mount(
        clone.as_raw_fd(),
        EMPTY,
        target.as_raw_fd(),
        EMPTY,
        libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .context("attaching a detached mount onto its target (move_mount)")
}
