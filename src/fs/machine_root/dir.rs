//! A directory inside a machine or container root ([`MachineDir`]): every operation on a name in
//! it goes through its descriptor and never follows a symlink at that name.

use super::*;

impl MachineDir {
    /// This directory's path inside the machine.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The machine path of `name` in this directory.
    pub fn child(&self, name: &str) -> String {
        join(&self.path, name)
    }

    /// `(st_dev, st_ino)`: tells two paths that resolve to one directory apart from two directories.
    pub fn identity(&self) -> Result<(u64, u64)> {
        let noun = self.tree.noun();
        let st = nix::sys::stat::fstat(&self.fd)
            .with_context(|| format!("stat {} in the {noun}", self.path))?;
        Ok((st.st_dev, st.st_ino))
    }

    /// Whether this directory is on a read-only mount.
    pub fn read_only(&self) -> Result<bool> {
        let st = nix::sys::statvfs::fstatvfs(&self.fd)
            .with_context(|| format!("statvfs {} in the machine", self.path))?;
        Ok(st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
    }

    /// `lstat` of `name`; `None` when missing.
    pub fn stat(&self, name: &str) -> Result<Option<FileStat>> {
        let noun = self.tree.noun();
        check_name(name)?;
        match nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("stat {} in the {noun}", self.child(name))),
        }
    }

    /// What `name` is, without following it; `None` when missing.
    pub fn kind(&self, name: &str) -> Result<Option<FileKind>> {
        Ok(self.stat(name)?.map(|st| FileKind::from_stat(&st)))
    }

    /// Open the directory `name` without following a symlink there.
    pub fn open_subdir(&self, name: &str) -> Result<Subdir> {
        let noun = self.tree.noun();
        match self.kind(name)? {
            None => return Ok(Subdir::Missing),
            Some(FileKind::Dir) => {}
            Some(k) => return Ok(Subdir::Other(k)),
        }
        let how = OpenHow::new()
            .flags(dir_flags() | OFlag::O_NOFOLLOW)
            .resolve(beneath_no_symlinks() | self.tree.walk());
        match openat2(&self.fd, name, how) {
            Ok(fd) => Ok(Subdir::Dir(MachineDir {
                fd,
                path: self.child(name),
                tree: self.tree,
            })),
            Err(Errno::ENOENT) => Ok(Subdir::Missing),
            Err(e) => Err(e).with_context(|| {
                format!(
                    "opening {} in the {noun} (changed underneath us?)",
                    self.child(name)
                )
            }),
        }
    }

    /// Open the directory `name`, creating it with `mode` when missing. Anything else there —
    /// a symlink included — is an error: this is for directories the helper owns.
    pub fn create_subdir(&self, name: &str, mode: u32) -> Result<MachineDir> {
        let noun = self.tree.noun();
        let path = self.child(name);
        match self.open_subdir(name)? {
            Subdir::Dir(d) => return Ok(d),
            Subdir::Other(k) => {
                bail!(
                    "{path} in the {noun} is a {} where a directory is expected",
                    k.as_str()
                )
            }
            Subdir::Missing => {}
        }
        // Created private, then opened without following symlinks and chmod-ed through the fd:
        // the umask never decides the mode, and a swap after mkdirat is refused.
        match nix::sys::stat::mkdirat(&self.fd, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e).with_context(|| format!("creating {path} in the {noun}")),
        }
        match self.open_subdir(name)? {
            Subdir::Dir(d) => {
                nix::sys::stat::fchmod(&d.fd, Mode::from_bits_truncate(mode))
                    .with_context(|| format!("chmod {path} in the {noun}"))?;
                Ok(d)
            }
            Subdir::Other(k) => {
                bail!(
                    "{path} in the {noun} is a {} where a directory is expected",
                    k.as_str()
                )
            }
            Subdir::Missing => bail!("{path} in the {noun} vanished right after mkdir"),
        }
    }

    /// Every entry except `.` and `..`, with its type when the filesystem reports it cheaply
    /// (use [`MachineDir::kind`] when `None`).
    pub fn entries(&self) -> Result<Vec<(OsString, Option<FileKind>)>> {
        let noun = self.tree.noun();
        // A fresh open file description: a dup would share (and exhaust) the read offset.
        let mut dir = nix::dir::Dir::openat(&self.fd, ".", dir_flags(), Mode::empty())
            .with_context(|| format!("listing {} in the {noun}", self.path))?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.with_context(|| format!("listing {} in the {noun}", self.path))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if out.len() >= MAX_ENTRIES {
                bail!(
                    "{} in the {noun} has more than {MAX_ENTRIES} entries",
                    self.path
                );
            }
            out.push((
                OsStr::from_bytes(name).to_owned(),
                entry.file_type().map(FileKind::from_dirent),
            ));
        }
        out.sort();
        Ok(out)
    }

    /// The target of the symlink `name`; `None` when missing or not a symlink.
    pub fn read_link(&self, name: &str) -> Result<Option<OsString>> {
        let noun = self.tree.noun();
        check_name(name)?;
        match nix::fcntl::readlinkat(&self.fd, name) {
            Ok(t) => Ok(Some(t)),
            Err(Errno::ENOENT | Errno::EINVAL) => Ok(None),
            Err(e) => {
                Err(e).with_context(|| format!("readlink {} in the {noun}", self.child(name)))
            }
        }
    }

    /// Open the regular file `name` for reading; `None` when missing or not a regular file.
    ///
    /// Never follows a symlink and never opens anything but a regular file, even when the
    /// machine swaps the entry between our checks: an `O_PATH` descriptor (which runs no
    /// driver's open, unlike opening a device node the machine planted) pins the inode, `fstat`
    /// on it must say "regular file", and only that inode is then reopened for reading through
    /// `/proc/self/fd`. What the caller reads is the file that was checked.
    pub fn open_regular(&self, name: &str) -> Result<Option<(std::fs::File, FileStat)>> {
        let noun = self.tree.noun();
        check_name(name)?;
        let path = self.child(name);
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(beneath_no_symlinks() | self.tree.walk());
        let pinned = match openat2(&self.fd, name, how) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ELOOP) => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("opening {path} in the {noun}")),
        };
        reopen_regular(&pinned, &path, noun)
    }

    /// The bytes of the regular file `name` (at most `max`); `None` when missing or not a
    /// regular file. Never opens a FIFO or device node, never follows a symlink.
    pub fn read_regular(&self, name: &str, max: usize) -> Result<Option<Vec<u8>>> {
        Ok(self.read_regular_stat(name, max)?.map(|(b, _)| b))
    }

    fn read_regular_stat(&self, name: &str, max: usize) -> Result<Option<(Vec<u8>, FileStat)>> {
        let noun = self.tree.noun();
        let path = self.child(name);
        let Some((file, st)) = self.open_regular(name)? else {
            return Ok(None);
        };
        Ok(Some((read_bounded(file, max, &path, noun)?, st)))
    }

    /// Atomically make `name` a regular file holding `contents` with `mode`: temp file in this
    /// directory → write → fchmod → fsync → renameat → fsync the directory. Nothing is written
    /// when the bytes and mode are already there. `point` names the moment between the temp
    /// file's fsync and the rename for crash tests. Returns whether the file was written.
    pub fn write_file(&self, name: &str, contents: &[u8], mode: u32, point: Point) -> Result<bool> {
        self.write_file_at(name, contents, mode, Some(point))
    }

    /// [`MachineDir::write_file`] where no crash test names the moment (the CDI hooks).
    pub fn write_file_unnamed(&self, name: &str, contents: &[u8], mode: u32) -> Result<bool> {
        self.write_file_at(name, contents, mode, None)
    }

    fn write_file_at(
        &self,
        name: &str,
        contents: &[u8],
        mode: u32,
        point: Option<Point>,
    ) -> Result<bool> {
        let noun = self.tree.noun();
        let path = self.child(name);
        // A fixed temp name, so a killed run's leftover is cleared by the next run, even one that
        // finds the bytes already in place; a leading dot and a `.tmp` suffix keep it invisible
        // to readers that scan the directory (the CDI cache). Callers hold the machine lock.
        let tmp = self.tree.tmp_name(name);
        check_name(&tmp)?;
        if self.remove_tree(&tmp)? {
            self.sync()?;
        }
        let existing = self.stat(name)?;
        let kind = existing.as_ref().map(FileKind::from_stat);
        // Only a file of the same size can hold the same bytes; never read more than that.
        let same_size = existing
            .is_some_and(|st| u64::try_from(st.st_size).ok() == Some(contents.len() as u64));
        match kind {
            Some(FileKind::Dir) => {
                bail!("{path} in the {noun} is a directory where a file is expected")
            }
            Some(FileKind::File) if same_size => {
                if let Some((old, st)) = self.read_regular_stat(name, contents.len())?
                    && old == contents
                    && st.st_mode & 0o7777 == mode
                {
                    return Ok(false);
                }
            }
            // Anything else (a symlink, a FIFO…) is replaced by the rename, never opened.
            _ => {}
        }
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
        let fd = openat2(&self.fd, tmp.as_str(), how)
            .with_context(|| format!("creating {} in the {noun}", self.child(&tmp)))?;
        crate::fs::atomic::replace_at(&self.fd, fd.into(), &tmp, name, contents, mode, point)
            .with_context(|| format!("writing {path} in the {noun}"))?;
        Ok(true)
    }

    /// Make `name` a symlink to `target`, replacing another symlink atomically (temp link +
    /// rename). Anything that is not a symlink is left alone and reported.
    pub fn symlink(&self, name: &str, target: &str) -> Result<LinkOutcome> {
        self.link(name, target, false)
    }

    /// Like [`MachineDir::symlink`], but a file of any kind there is replaced too (a container
    /// image's stale copy at a path we link); a directory is an error.
    pub fn symlink_over_file(&self, name: &str, target: &str) -> Result<LinkOutcome> {
        self.link(name, target, true)
    }

    fn link(&self, name: &str, target: &str, over_files: bool) -> Result<LinkOutcome> {
        let noun = self.tree.noun();
        let path = self.child(name);
        let outcome = match self.kind(name)? {
            None => LinkOutcome::Created,
            Some(FileKind::Symlink) => {
                if self.read_link(name)?.as_deref() == Some(OsStr::new(target)) {
                    return Ok(LinkOutcome::Unchanged);
                }
                LinkOutcome::Replaced
            }
            Some(FileKind::Dir) if over_files => bail!(
                "{path} in the {noun} is a directory; not replacing it with a symlink to {target}"
            ),
            Some(_) if over_files => LinkOutcome::Replaced,
            Some(k) => return Ok(LinkOutcome::Blocked(k)),
        };
        if outcome == LinkOutcome::Created {
            match nix::unistd::symlinkat(target, &self.fd, name) {
                Ok(()) => return Ok(outcome),
                // Appeared since we looked: fall through to an atomic replace.
                Err(Errno::EEXIST) => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("creating symlink {path} in the {noun}"));
                }
            }
        }
        let tmp = self.tree.tmp_name(name);
        self.remove_tree(&tmp)?;
        nix::unistd::symlinkat(target, &self.fd, tmp.as_str())
            .with_context(|| format!("creating symlink {} in the {noun}", self.child(&tmp)))?;
        if let Err(e) = nix::fcntl::renameat(&self.fd, tmp.as_str(), &self.fd, name) {
            let _ = nix::unistd::unlinkat(&self.fd, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(e).with_context(|| format!("replacing {path} in the {noun}"));
        }
        Ok(LinkOutcome::Replaced)
    }

    /// Remove `name` if it is not a directory. Returns whether something was removed.
    pub fn remove_file(&self, name: &str) -> Result<bool> {
        let noun = self.tree.noun();
        match self.kind(name)? {
            None => Ok(false),
            Some(FileKind::Dir) => {
                bail!(
                    "{} in the {noun} is a directory; not removing it",
                    self.child(name)
                )
            }
            Some(_) => match nix::unistd::unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) => Ok(true),
                Err(Errno::ENOENT) => Ok(false),
                Err(e) => {
                    Err(e).with_context(|| format!("removing {} in the {noun}", self.child(name)))
                }
            },
        }
    }

    /// Remove `name` and, if it is a directory, everything under it: by fd, never following a
    /// symlink, never crossing into another mount (a bind mount planted inside a tree we own must
    /// not make us delete what it exposes), at most [`MAX_DEPTH`] deep.
    pub fn remove_tree(&self, name: &str) -> Result<bool> {
        self.remove_tree_at(name, 0)
    }

    fn remove_tree_at(&self, name: &str, depth: usize) -> Result<bool> {
        let noun = self.tree.noun();
        let path = self.child(name);
        let Some(st) = self.stat(name)? else {
            return Ok(false);
        };
        if FileKind::from_stat(&st) != FileKind::Dir {
            return self.remove_file(name);
        }
        if depth >= MAX_DEPTH {
            bail!("{path} in the {noun} is nested deeper than {MAX_DEPTH} levels; not removing it");
        }
        let how = OpenHow::new()
            .flags(dir_flags() | OFlag::O_NOFOLLOW)
            .resolve(beneath_no_symlinks() | ResolveFlag::RESOLVE_NO_XDEV);
        let fd = openat2(&self.fd, name, how)
            .with_context(|| format!("opening {path} in the {noun} for removal"))?;
        let sub = MachineDir {
            fd,
            path,
            tree: self.tree,
        };
        let (dev, _) = self.identity()?;
        if sub.identity()?.0 != dev {
            bail!(
                "{} in the {noun} is another mount; not removing it",
                sub.path
            );
        }
        for (child, _) in sub.entries()? {
            let Some(child) = child.to_str() else {
                bail!(
                    "{} in the {noun} holds a non-UTF-8 name; not removing it",
                    sub.path
                );
            };
            sub.remove_tree_at(child, depth + 1)?;
        }
        match nix::unistd::unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(true),
            Err(e) => Err(e).with_context(|| format!("removing {} in the {noun}", sub.path)),
        }
    }

    /// Atomically exchange two entries of this directory (`renameat2(RENAME_EXCHANGE)`).
    pub fn exchange(&self, a: &str, b: &str) -> Result<()> {
        let noun = self.tree.noun();
        check_name(a)?;
        check_name(b)?;
        nix::fcntl::renameat2(&self.fd, a, &self.fd, b, RenameFlags::RENAME_EXCHANGE).with_context(
            || {
                format!(
                    "exchanging {} and {} in the {noun}",
                    self.child(a),
                    self.child(b)
                )
            },
        )
    }

    /// Rename `from` to `to` in this directory, failing if `to` exists.
    pub fn rename_noreplace(&self, from: &str, to: &str) -> Result<()> {
        let noun = self.tree.noun();
        check_name(from)?;
        check_name(to)?;
        nix::fcntl::renameat2(&self.fd, from, &self.fd, to, RenameFlags::RENAME_NOREPLACE)
            .with_context(|| {
                format!(
                    "renaming {} to {} in the {noun}",
                    self.child(from),
                    self.child(to)
                )
            })
    }

    /// Move `name` from this directory to `to` in `dest` (same filesystem), failing if `to`
    /// exists there: nothing is ever overwritten.
    pub fn move_noreplace(&self, name: &str, dest: &MachineDir, to: &str) -> Result<()> {
        let noun = self.tree.noun();
        check_name(name)?;
        check_name(to)?;
        nix::fcntl::renameat2(&self.fd, name, &dest.fd, to, RenameFlags::RENAME_NOREPLACE)
            .with_context(|| {
                format!(
                    "moving {} to {} in the {noun}",
                    self.child(name),
                    dest.child(to)
                )
            })
    }

    /// fsync this directory, making renames and removals in it durable.
    pub fn sync(&self) -> Result<()> {
        let noun = self.tree.noun();
        nix::unistd::fsync(&self.fd)
            .with_context(|| format!("fsync directory {} in the {noun}", self.path))
    }

    /// Every entry below this directory (never following a symlink, at most [`MAX_DEPTH`] deep,
    /// at most `max` entries), as paths relative to it with their kind and, for symlinks, target.
    /// `None` when there are more than `max` entries.
    pub fn walk(&self, max: usize) -> Result<Option<Vec<WalkEntry>>> {
        let mut out = Vec::new();
        if self.walk_into("", 0, max, &mut out)? {
            Ok(Some(out))
        } else {
            Ok(None)
        }
    }

    fn walk_into(
        &self,
        prefix: &str,
        depth: usize,
        max: usize,
        out: &mut Vec<WalkEntry>,
    ) -> Result<bool> {
        let noun = self.tree.noun();
        if depth >= MAX_DEPTH {
            bail!(
                "{} in the {noun} is nested deeper than {MAX_DEPTH} levels",
                self.path
            );
        }
        for (name, _) in self.entries()? {
            let Some(name) = name.to_str() else {
                return Ok(false);
            };
            if out.len() >= max {
                return Ok(false);
            }
            let Some(st) = self.stat(name)? else {
                continue;
            };
            let kind = FileKind::from_stat(&st);
            let rel = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            };
            let target = match kind {
                FileKind::Symlink => self
                    .read_link(name)?
                    .map(|t| t.to_string_lossy().into_owned()),
                _ => None,
            };
            out.push(WalkEntry {
                path: rel.clone(),
                kind,
                mode: st.st_mode & 0o7777,
                target,
            });
            if kind == FileKind::Dir {
                match self.open_subdir(name)? {
                    Subdir::Dir(sub) => {
                        if !sub.walk_into(&rel, depth + 1, max, out)? {
                            return Ok(false);
                        }
                    }
                    _ => return Ok(false),
                }
            }
        }
        Ok(true)
    }
}

/// One entry found by [`MachineDir::walk`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WalkEntry {
    /// Relative to the walked directory, `/`-separated.
    pub path: String,
    pub kind: FileKind,
    /// Permission bits (meaningless for symlinks).
    pub mode: u32,
    pub target: Option<String>,
}
