//! post-start's import of the staged images: every tarball in the staged-images directory is
//! imported into containerd in the machine (`ctr images import`, as a transient unit of its
//! systemd), one at a time within the import budget; one that fails is set aside under
//! [`FAILED_DIR`], never retried in a loop, and never fails the start.

use crate::config::MachineConfig;
use crate::failpoint::{self, Point};
use crate::fs::machine_root::{FileKind, MachineDir, MachineRoot};
use crate::systemd::services::Services;
use crate::types::machine_name::Subject;
use anyhow::Result;
use std::os::fd::AsFd as _;
use std::time::{Duration, Instant};

/// Where tarballs that failed to import are moved, under the staged-images directory.
pub(crate) const FAILED_DIR: &str = "failed";

/// Shortest time left in the import budget worth starting another import with.
const MIN_IMPORT_TIME: Duration = Duration::from_secs(1);
/// Most tarball names one "left for the next start" line spells out.
const MAX_NAMES_LOGGED: usize = 50;
/// Longest file name the kernel takes (`NAME_MAX`).
pub(crate) const NAME_MAX: usize = 255;

/// Import the staged `*.tar` files with `ctr images import`, each as a transient unit in the
/// machine, within the per-start bounds: at most `importMaxImages` imports and
/// `importBudgetSeconds` in all, each import's deadline the smaller of `importTimeoutSeconds` and
/// what is left of the budget. What is not reached stays in place for the next start and is
/// reported in one line (how many, which, why). A tarball that fails (or times out on its own
/// deadline) is moved to `failed/` beside it and reported with the command's output; it is never
/// deleted and never fails the start, so one bad image cannot crash-loop a node. An import cut
/// short by the budget is left in place instead: the tarball is not known to be bad.
///
/// Imported tarballs stay where they are and are imported again at every start (so the images
/// survive a containerd store that was wiped). The queue is least recently imported first: after
/// an import the tarball's mtime is set to now, so when there are more tarballs than one start
/// takes, successive starts work through all of them instead of importing the same first ones
/// every time, and a tarball staged since the last start waits at most a few starts.
/// Returns (imported, set aside).
pub fn import_images(
    machine: Subject,
    root: &MachineRoot,
    mc: &MachineConfig,
    services: &dyn Services,
) -> Result<(usize, usize)> {
    let Some(dir) = root.open_dir(&mc.staged_images_dir)? else {
        tracing::debug!(%machine, dir = %mc.staged_images_dir, "no staged images directory");
        return Ok((0, 0));
    };
    let queue = staged_queue(machine, &dir)?;
    let mut imports = Imports {
        machine,
        mc,
        services,
        dir: &dir,
        budget_end: Instant::now() + mc.import_budget,
        imported: 0,
        failed: 0,
        tried: 0,
        left: Vec::new(),
        why_left: String::new(),
    };
    for name in queue {
        imports.take(name)?;
    }
    imports.report_left();
    Ok((imports.imported, imports.failed))
}

/// The staged `*.tar` regular files of `dir`, least recently imported (oldest mtime) first.
fn staged_queue(machine: Subject, dir: &MachineDir) -> Result<Vec<String>> {
    let mut queue = Vec::new();
    for (name, _) in dir.entries()? {
        let name = match name.into_string() {
            Ok(n) => n,
            Err(raw) => {
                if raw.as_encoded_bytes().ends_with(b".tar") {
                    tracing::warn!(
                        %machine,
                        dir = %dir.path(),
                        image = %raw.to_string_lossy().escape_debug(),
                        "staged image name is not UTF-8; skipped"
                    );
                }
                continue;
            }
        };
        if !name.ends_with(".tar") || name.starts_with('.') {
            continue;
        }
        // Only regular files: a FIFO would hang ctr, a symlink could name anything. Checked
        // again on the descriptor ctr reads (below); this only sorts and skips early.
        match dir.stat(&name)? {
            Some(st) if FileKind::from_stat(&st) == FileKind::File => {
                queue.push(((st.st_mtime, st.st_mtime_nsec), name));
            }
            _ => tracing::warn!(
                %machine,
                image = %shown(&dir.child(&name)),
                "not a regular file; skipped"
            ),
        }
    }
    queue.sort();
    Ok(queue.into_iter().map(|(_, name)| name).collect())
}

/// One start's imports, within its bounds (see [`import_images`]).
struct Imports<'a> {
    machine: Subject<'a>,
    mc: &'a MachineConfig,
    services: &'a dyn Services,
    dir: &'a MachineDir,
    budget_end: Instant,
    imported: usize,
    failed: usize,
    tried: usize,
    /// Tarballs left for the next start, and why.
    left: Vec<String>,
    why_left: String,
}

impl Imports<'_> {
    /// Import `name`, or leave it for the next start when a bound is reached.
    fn take(&mut self, name: String) -> Result<()> {
        if !self.left.is_empty() {
            self.left.push(name);
            return Ok(());
        }
        let remaining = self.budget_end.saturating_duration_since(Instant::now());
        if self.tried >= self.mc.import_max_images {
            self.why_left = format!(
                "importMaxImages = {} imports per start",
                self.mc.import_max_images
            );
            self.left.push(name);
            return Ok(());
        }
        if remaining < MIN_IMPORT_TIME {
            self.why_left = format!(
                "the import budget (importBudgetSeconds = {}) is spent",
                self.mc.import_budget.as_secs()
            );
            self.left.push(name);
            return Ok(());
        }
        self.import(name, self.mc.import_timeout.min(remaining))
    }

    /// Run `ctr images import` on `name` within `timeout` and act on its outcome.
    fn import(&mut self, name: String, timeout: Duration) -> Result<()> {
        let (machine, mc) = (self.machine, self.mc);
        let path = self.dir.child(&name);
        // The check and the use are one file: ctr reads the descriptor opened here (a regular
        // file, never a symlink, FIFO or device; see MachineDir::open_regular) as its stdin,
        // not a path it would resolve again. No name reaches its command line either, so a
        // name with a leading `-`, a newline or any other byte is only ever a directory entry.
        // Worst case left to the machine: it rewrites the file's bytes while ctr reads them, so
        // ctr (which runs in the machine, as a transient unit of the machine's systemd) imports
        // or rejects what the machine wrote; it cannot make the helper read or write anything
        // outside the machine. The only write below is a rename between two directory fds
        // inside the machine, which never follows a symlink.
        let Some((file, _)) = self.dir.open_regular(&name)? else {
            tracing::warn!(%machine, image = %shown(&path), "no longer a regular file; skipped");
            return Ok(());
        };
        self.tried += 1;
        let argv = [
            mc.ctr_path.as_str(),
            "-n",
            mc.ctr_namespace.as_str(),
            "images",
            "import",
            "-",
        ];
        let run = self.services.run(
            "nspawn-lifecycle-import",
            &argv,
            Some(file.as_fd()),
            timeout,
        );
        failpoint::hit(Point::MidImageImport);
        // Cut short: not the start's first import (which had the whole budget, or its own
        // full deadline) and given less than its own deadline because the budget ran low.
        let cut_short = self.tried > 1
            && timeout < mc.import_timeout
            && match &run {
                Ok(o) => o.result == "timeout",
                Err(_) => Instant::now() >= self.budget_end,
            };
        let outcome = run.and_then(|o| o.check(&format!("importing {}", shown(&path))).map(|()| o));
        match outcome {
            Ok(o) => {
                self.imported += 1;
                // Least recently imported first next time (see import_images).
                let now = nix::sys::time::TimeSpec::UTIME_NOW;
                let omit = nix::sys::time::TimeSpec::UTIME_OMIT;
                if let Err(e) = nix::sys::stat::futimens(&file, &omit, &now) {
                    tracing::debug!(%machine, image = %shown(&path), "setting its mtime: {e}");
                }
                tracing::info!(%machine, image = %shown(&path), "imported in {:.1}s", o.elapsed.as_secs_f64());
            }
            Err(e) if cut_short => {
                tracing::warn!(%machine, image = %shown(&path), "import stopped at the end of the import budget: {e:#}");
                self.why_left = format!(
                    "the import budget (importBudgetSeconds = {}) ran out during an import",
                    mc.import_budget.as_secs()
                );
                self.left.push(name);
            }
            Err(e) => self.set_aside(&name, &e)?,
        }
        Ok(())
    }

    /// Move a tarball whose import failed to `failed/`, under a name not taken there yet.
    fn set_aside(&mut self, name: &str, e: &anyhow::Error) -> Result<()> {
        self.failed += 1;
        let failed_dir = self.dir.create_subdir(FAILED_DIR, 0o755)?;
        let mut to = aside_name(name, 0);
        let mut n = 1;
        while failed_dir.kind(&to)?.is_some() {
            to = aside_name(name, n);
            n += 1;
        }
        self.dir.move_noreplace(name, &failed_dir, &to)?;
        failed_dir.sync()?;
        self.dir.sync()?;
        tracing::error!(
            machine = %self.machine,
            image = %shown(&self.dir.child(name)),
            moved_to = %shown(&failed_dir.child(&to)),
            "image import failed; tarball set aside: {e:#}"
        );
        Ok(())
    }

    /// One line for what is left for the next start: how many, which, why.
    fn report_left(&self) {
        if self.left.is_empty() {
            return;
        }
        let mut names: Vec<String> = self
            .left
            .iter()
            .take(MAX_NAMES_LOGGED)
            .map(|n| shown(n))
            .collect();
        if self.left.len() > MAX_NAMES_LOGGED {
            names.push(format!("… and {} more", self.left.len() - MAX_NAMES_LOGGED));
        }
        tracing::warn!(
            machine = %self.machine,
            "left {} staged image(s) in {} for the next start ({}): {}",
            self.left.len(),
            self.dir.path(),
            self.why_left,
            names.join(", ")
        );
    }
}

/// A name or path for a log line: control characters (a newline would forge a journal line),
/// quotes and backslashes escaped.
fn shown(s: &str) -> String {
    s.escape_debug().to_string()
}

/// The name a failed tarball gets in `failed/`: its own, then `<name>.<n>`; shortened (at a
/// character boundary) where the suffix would pass `NAME_MAX`.
fn aside_name(name: &str, n: usize) -> String {
    let suffix = if n == 0 {
        String::new()
    } else {
        format!(".{n}")
    };
    let mut keep = name.len().min(NAME_MAX - suffix.len());
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{suffix}", &name[..keep])
}
