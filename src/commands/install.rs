//! `install` and `uninstall`: put the helper, its unit drop-in and the machine's `.nspawn` file in
//! place on a host (or take them away again), migrating what an older agent left behind.
//!
//! Both commands first build a plan from what is on disk, then apply it. A plan with nothing to
//! do writes nothing (not even the lock file), so a second run leaves every mtime alone, and
//! `--dry-run` prints the plan instead of applying it. Everything that can fail on bad input
//! fails while planning, before the first write.
//!
//! Decisions an operator should know:
//! - NVIDIA state incomplete right now (a driver install in progress): the helper and drop-in
//!   are still installed and the `.nspawn` file is skipped with a note; pre-start renders it at
//!   every start and refuses to start until the state is complete.
//! - A `.nspawn` file pre-start did not write is replaced only when everything in it is
//!   something pre-start renders from the host (GPU, DRM, KVM and driver binds, its `[Exec]`
//!   settings) or a configured mount; anything else is bad input (exit 2), since pre-start would
//!   silently drop it at the next start.
//! - `override.conf` is migrated only when it carries an older agent's marks (see
//!   `legacy::is_legacy_mark`): settings our drop-in now has, or that would override it, are
//!   removed; everything else is kept and reported. An `override.conf` without those marks is
//!   the operator's (`systemctl edit`) and is never changed; nor is any other drop-in. Overlaps
//!   with ours in those files are reported as warnings.
//! - `uninstall` does not restore what a migration removed: those settings were the older
//!   agent's, which is gone.
//! - `uninstall` replaces the rendered `.nspawn` file with the same settings minus the GPU, KVM
//!   and gate binds (`PrivateUsers=no` above all) rather than deleting it: without one, the
//!   stock unit's `-U` makes systemd-nspawn chown the whole rootfs to a private UID range.
//! - No machine image (a mistyped name), or a directory image whose root an earlier `-U` start
//!   shifted off UID 0: install refuses (exit 2) before writing anything, as pre-start does
//!   (src/model/image.rs); the message names every place looked at, or the command that shifts the
//!   rootfs back.

use crate::Ctx;
use crate::config::{Gpus, MachineConfig};
use crate::error::{Classified, Kind, bad_input};
use crate::failpoint::Point;
use crate::fs::host::HostRoot;
use crate::fs::lock;
use crate::model::dropin::{DROPIN_HEADER, Dropin, exec_escape};
use crate::model::legacy::{
    LEGACY_OVERRIDE, foreign_nspawn_losses, is_ours_nspawn, migrate_override, overlaps,
};
use crate::model::nspawn::{NspawnFile, describe_change};
use crate::types::machine_name::MachineName;
use crate::types::paths::HostPath;
use crate::types::units::{
    DROPIN_NAME, UNIT_DIR, dropin_dir, dropin_dir_machine, dropin_path, nspawn_path,
    template_dropin_dir, unit_name,
};
use anyhow::{Context as _, Result};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// Plans: what would change, file by file.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Create,
    Update,
    Rewrite,
    Remove,
    Unchanged,
    Skip,
    Keep,
}

impl Verb {
    /// The action's name in `--json`'s report.
    fn name(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Rewrite => "rewrite",
            Verb::Remove => "remove",
            Verb::Unchanged => "unchanged",
            Verb::Skip => "skip",
            Verb::Keep => "keep",
        }
    }

    /// The word for the report: what was done, or with `--dry-run` what would be.
    fn word(self, dry_run: bool) -> &'static str {
        let (done, would) = match self {
            Verb::Create => ("created", "would create"),
            Verb::Update => ("updated", "would update"),
            Verb::Rewrite => ("rewritten", "would rewrite"),
            Verb::Remove => ("removed", "would remove"),
            Verb::Unchanged => ("unchanged", "unchanged"),
            Verb::Skip => ("skipped", "would skip"),
            Verb::Keep => ("kept", "kept"),
        };
        if dry_run { would } else { done }
    }
}

#[derive(Debug)]
enum Op {
    /// `point`: the crash-test point between the temp file and the rename.
    Write {
        bytes: Vec<u8>,
        mode: u32,
        point: Point,
    },
    Remove,
    RemoveDir,
    /// A symlink to this target (replacing whatever link was there).
    Symlink(String),
    /// A directory and everything in it, never following a link (src/apply/driver_tree.rs).
    RemoveTree,
}

#[derive(Debug)]
struct FileLine {
    /// The path as the host sees it (`/etc/…`), resolved inside the host root to act on it.
    shown: String,
    verb: Verb,
    detail: String,
    op: Option<Op>,
    /// A unit file: changing it needs a daemon-reload.
    unit_file: bool,
}

#[derive(Debug)]
struct Plan {
    command: &'static str,
    /// The machine, or `--host`.
    subject: String,
    files: Vec<FileLine>,
    warnings: Vec<String>,
}

impl FileLine {
    /// A line that changes nothing; `op` and `unit_file` are set by the callers that need them.
    fn new(shown: &str, verb: Verb, detail: String) -> FileLine {
        FileLine {
            shown: shown.to_owned(),
            verb,
            detail,
            op: None,
            unit_file: false,
        }
    }

    /// A line removing the file `shown`.
    fn removing(shown: &str, detail: &str) -> FileLine {
        FileLine {
            op: Some(Op::Remove),
            ..FileLine::new(shown, Verb::Remove, detail.to_owned())
        }
    }
}

impl Plan {
    fn new(command: &'static str, subject: &str) -> Plan {
        Plan {
            command,
            subject: subject.to_owned(),
            files: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn changes(&self) -> usize {
        self.files.iter().filter(|f| f.op.is_some()).count()
    }

    fn needs_reload(&self) -> bool {
        self.files.iter().any(|f| f.op.is_some() && f.unit_file)
    }

    fn apply(&self, host: &HostRoot) -> Result<()> {
        for f in &self.files {
            match &f.op {
                None => {}
                Some(Op::Write { bytes, mode, point }) => {
                    host.write_if_changed(&f.shown, bytes, *mode, *point)?;
                }
                Some(Op::Remove) => {
                    host.remove_file(&f.shown)?;
                }
                Some(Op::RemoveTree) => {
                    crate::apply::driver_tree::remove_path(host, &f.shown)?;
                }
                Some(Op::Symlink(target)) => host.symlink(&f.shown, target)?,
                Some(Op::RemoveDir) => match host.remove_dir(&f.shown) {
                    Ok(()) => {}
                    // Something appeared meanwhile: it is not ours to remove.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
                        ) => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("removing {}", host.path(&f.shown).display())
                        });
                    }
                },
            }
        }
        Ok(())
    }

    /// The report as one object (`--json`, kind `InstallReport`): each file's action (done, or
    /// with `dryRun` to be done), warnings, systemd, and how many files change.
    fn json(&self, dry_run: bool, reload: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": crate::discovery::API_VERSION,
            "kind": "InstallReport",
            "command": self.command,
            "subject": self.subject,
            "dryRun": dry_run,
            "files": self.files.iter().map(|f| serde_json::json!({
                "path": f.shown,
                "action": f.verb.name(),
                "detail": f.detail,
            })).collect::<Vec<_>>(),
            "warnings": self.warnings,
            "systemd": reload,
            "changes": self.changes(),
        })
    }

    /// The operator's report: one line per file, then systemd, then a summary.
    fn report(&self, dry_run: bool, reload: &str) -> String {
        let mut s = String::new();
        for f in &self.files {
            s.push_str(&format!("{}: {}", f.shown, f.verb.word(dry_run)));
            if !f.detail.is_empty() {
                s.push_str(&format!(" ({})", f.detail));
            }
            s.push('\n');
        }
        for w in &self.warnings {
            s.push_str(&format!("warning: {w}\n"));
        }
        s.push_str(&format!("systemd: {reload}\n"));
        let n = self.changes();
        let what = match (n, dry_run) {
            (0, _) => "nothing changed".to_owned(),
            (n, false) => format!("{n} file{} changed", if n == 1 { "" } else { "s" }),
            (n, true) => format!(
                "dry run, nothing written; {n} file{} would change",
                if n == 1 { "" } else { "s" }
            ),
        };
        s.push_str(&format!("{} {}: {what}\n", self.command, self.subject));
        s
    }
}

fn read_optional(host: &HostRoot, shown: &str) -> Result<Option<Vec<u8>>> {
    match host.read(shown) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", host.path(shown).display())),
    }
}

fn read_text(host: &HostRoot, shown: &str) -> Result<Option<String>> {
    read_optional(host, shown)?
        .map(|b| {
            String::from_utf8(b)
                .map_err(|_| bad_input(format!("{} is not UTF-8", host.path(shown).display())))
        })
        .transpose()
}

fn mode_of(host: &HostRoot, shown: &str) -> Result<u32> {
    Ok(host
        .metadata(shown)
        .with_context(|| format!("stat {}", host.path(shown).display()))?
        .permissions()
        .mode()
        & 0o7777)
}

/// A line for writing `bytes` to `shown`: created, updated, or unchanged.
fn write_line(
    host: &HostRoot,
    shown: &str,
    bytes: Vec<u8>,
    mode: u32,
    unit_file: bool,
    point: Point,
    detail: impl FnOnce(Option<&[u8]>) -> String,
) -> Result<FileLine> {
    let old = read_optional(host, shown)?;
    let same = match &old {
        Some(o) => *o == bytes && mode_of(host, shown)? == mode,
        None => false,
    };
    let verb = match (&old, same) {
        (_, true) => Verb::Unchanged,
        (None, _) => Verb::Create,
        (Some(_), false) => Verb::Update,
    };
    let detail = if same {
        String::new()
    } else {
        detail(old.as_deref())
    };
    Ok(FileLine {
        shown: shown.to_owned(),
        verb,
        detail,
        op: (!same).then_some(Op::Write { bytes, mode, point }),
        unit_file,
    })
}

fn is_driver_incomplete(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<Classified>())
        .any(|c| c.kind == Kind::DriverIncomplete)
}

/// The drop-ins in `dir` other than ours (and `override.conf`, when `skip_override`: it has its
/// own line), sorted the way systemd applies them.
fn other_dropins(host: &HostRoot, dir: &str, skip_override: bool) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let entries = match host.read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("listing {}", host.path(dir).display())),
    };
    for (name, _) in entries {
        let name = name.to_string_lossy().into_owned();
        if name.ends_with(".conf")
            && name != DROPIN_NAME
            && !(skip_override && name == LEGACY_OVERRIDE)
        {
            let shown = format!("{dir}/{name}");
            out.push((name, shown));
        }
    }
    out.sort();
    Ok(out)
}

/// `install`'s plan: the helper, the `.nspawn` file and our drop-in, in that order (a run killed
/// between them leaves hooks that call a helper already in place), then what older layouts left.
fn plan_install(ctx: &Ctx, machine: &MachineName, exe: &[u8]) -> Result<Plan> {
    let host = &ctx.host;
    let mc = ctx.config.machine(host, machine)?;
    // The same lookup as pre-start: no image (a mistyped name) or a rootfs shifted by an earlier
    // `-U` start is bad input, refused before anything is written.
    crate::model::image::require(host, machine, &mc)?;
    let helper = ctx.config.helper_path();
    let mut plan = Plan::new("install", machine.as_str());
    plan.files.push(helper_copy(host, helper, exe)?);
    plan.files.push(nspawn_render(ctx, machine, &mc)?);
    plan.files
        .push(dropin_write(host, machine, helper, &mc.gpus)?);
    // The templates the drop-in wants (shared by every machine; uninstall removes them with the
    // helper). After it: a drop-in that wants a unit not written yet starts without it.
    for f in crate::model::host_devices::devices_unit_files(helper) {
        plan.files.push(write_line(
            host,
            &f.path,
            f.text.into_bytes(),
            0o644,
            true,
            Point::InstallMidDropinWrite,
            |_| "watches the NVIDIA node directories while a machine runs".to_owned(),
        )?);
    }
    override_migration(host, machine, &mut plan)?;
    plan.warnings.extend(overlap_warnings(host, machine)?);
    Ok(plan)
}

/// The helper at its stable path, so the hooks survive whatever installed it.
fn helper_copy(host: &HostRoot, helper: &HostPath, exe: &[u8]) -> Result<FileLine> {
    write_line(
        host,
        helper,
        exe.to_vec(),
        0o755,
        false,
        Point::InstallMidHelperCopy,
        |old| match old {
            None => format!("copy of the running helper, {} bytes", exe.len()),
            Some(_) => format!("replaced by the running helper, {} bytes", exe.len()),
        },
    )
}

/// The `.nspawn` file, rendered exactly as pre-start would; skipped while the NVIDIA state is
/// incomplete. A file another tool wrote is replaced only when pre-start would lose nothing of it.
fn nspawn_render(ctx: &Ctx, machine: &MachineName, mc: &MachineConfig) -> Result<FileLine> {
    let host = &ctx.host;
    let shown = nspawn_path(machine);
    let old = read_text(host, &shown)?;
    let foreign = old.as_deref().filter(|t| !is_ours_nspawn(t.as_bytes()));
    if let Some(text) = foreign {
        refuse_lost_settings(mc, &shown, text)?;
    }
    match crate::model::render::render(ctx, machine, mc) {
        Ok(r) => {
            let bytes = r.text().into_bytes();
            write_line(
                host,
                &shown,
                bytes.clone(),
                0o644,
                false,
                Point::InstallMidNspawnWrite,
                |old| {
                    let change = nspawn_change(old, &bytes);
                    if foreign.is_some() {
                        format!("replaces the file an older agent wrote; {change}")
                    } else {
                        change
                    }
                },
            )
        }
        Err(e) if is_driver_incomplete(&e) => Ok(FileLine::new(
            &shown,
            Verb::Skip,
            format!(
                "pre-start renders it at the next start that finds the driver complete; now: {e:#}"
            ),
        )),
        Err(e) => Err(e.context(format!("rendering {shown}"))),
    }
}

/// Bad input when pre-start would drop settings of the foreign `.nspawn` file `text`.
fn refuse_lost_settings(mc: &MachineConfig, shown: &str, text: &str) -> Result<()> {
    let config_binds: Vec<String> = mc
        .mounts
        .iter()
        .map(|m| {
            crate::model::nspawn::BindLine {
                source: m.source.clone(),
                target: m.target.clone(),
                read_only: m.read_only,
            }
            .to_string()
        })
        .collect();
    let lost = foreign_nspawn_losses(text, &config_binds);
    if lost.is_empty() {
        return Ok(());
    }
    Err(bad_input(format!(
        "{shown} was not written by nspawn-lifecycle and pre-start would drop these \
         settings from it at the next start: {}. Move extra binds into \"mounts\" in {} \
         (or delete the lines), then run install again; nothing was changed",
        lost.join(", "),
        mc.config_file
    )))
}

/// What a new `.nspawn` file changes: the difference from `old`, or the new file's host summary.
fn nspawn_change(old: Option<&[u8]>, new: &[u8]) -> String {
    let new = String::from_utf8_lossy(new);
    match old.map(String::from_utf8_lossy) {
        Some(old) => describe_change(Some(&old), &new),
        None => new
            .lines()
            .find_map(|l| l.strip_prefix("# Host: "))
            .unwrap_or_default()
            .to_owned(),
    }
}

/// Our drop-in, rendered from the machine and the helper's stable path.
fn dropin_write(
    host: &HostRoot,
    machine: &MachineName,
    helper: &HostPath,
    gpus: &Gpus,
) -> Result<FileLine> {
    let dropin = Dropin::for_gpus(machine, helper, gpus).to_string();
    write_line(
        host,
        &dropin_path(machine),
        dropin.into_bytes(),
        0o644,
        true,
        Point::InstallMidDropinWrite,
        |old| match old {
            Some(o) if !o.starts_with(DROPIN_HEADER.as_bytes()) => {
                "replaces a file of the same name install did not write".to_owned()
            }
            _ => String::new(),
        },
    )
}

/// The older layout's `override.conf`: rewritten or removed when an older agent wrote it, else
/// kept (with a warning when it overrides or repeats ours).
fn override_migration(host: &HostRoot, machine: &MachineName, plan: &mut Plan) -> Result<()> {
    let shown = format!("{}/{LEGACY_OVERRIDE}", dropin_dir(machine));
    let Some(text) = read_text(host, &shown)? else {
        return Ok(());
    };
    let m = migrate_override(&text, machine);
    let removed = format!(
        "moved to {DROPIN_NAME} or dropped as conflicting: {}",
        m.removed.join(" | ")
    );
    let kept = format!(
        "kept, not managed by nspawn-lifecycle: {}",
        m.kept.join(" | ")
    );
    let mode = mode_of(host, &shown)?;
    let line = |verb, detail: String, op| FileLine {
        op,
        unit_file: true,
        ..FileLine::new(&shown, verb, detail)
    };
    plan.files.push(match m.rewrite {
        None => {
            let o = overlaps(&text, machine, true);
            if !o.is_empty() {
                plan.warnings.push(format!(
                    "{shown} is not an older agent's layout, so it was left alone, but \
                     it overrides or repeats settings of {DROPIN_NAME}: {}",
                    o.join(" | ")
                ));
            }
            line(
                Verb::Keep,
                "not an older agent's layout; left to the operator".into(),
                None,
            )
        }
        Some(None) => line(Verb::Remove, removed, Some(Op::Remove)),
        Some(Some(new)) => line(
            Verb::Rewrite,
            format!("{removed}; {kept}"),
            Some(Op::Write {
                bytes: new.into_bytes(),
                mode,
                point: Point::InstallMidOverrideWrite,
            }),
        ),
    });
    Ok(())
}

/// Other drop-ins (this machine's and the template's, which systemd merges with them by file
/// name) are the operator's: never changed, but overlaps are worth knowing.
fn overlap_warnings(host: &HostRoot, machine: &MachineName) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for (dir, skip_override) in [(dropin_dir(machine), true), (template_dropin_dir(), false)] {
        for (name, shown) in other_dropins(host, &dir, skip_override)? {
            let Some(text) = read_text(host, &shown)? else {
                continue;
            };
            let o = overlaps(&text, machine, name.as_str() > DROPIN_NAME);
            if !o.is_empty() {
                warnings.push(format!(
                    "{dir}/{name} overlaps settings of {DROPIN_NAME} and was left alone: {}",
                    o.join(" | ")
                ));
            }
        }
    }
    Ok(warnings)
}

/// What install and uninstall ask the host's systemd: `reload` is `daemon-reload`; `pending`
/// tells whether the unit still runs from unit files older than those on disk
/// (`NeedDaemonReload`). A run killed after writing a unit file and before reloading leaves the
/// next run nothing to write: only `pending` tells it the reload is still owed.
pub struct HostSystemd<'a> {
    pub reload: &'a dyn Fn() -> Result<()>,
    pub pending: &'a dyn Fn(&str) -> Result<bool>,
}

/// How install and uninstall run and report: `dry_run` writes nothing; `json` prints the
/// report as one object (kind `InstallReport`) instead of lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct How {
    pub dry_run: bool,
    pub json: bool,
}

/// Plan, and apply unless `dry_run` or there is nothing to do; the lock is only taken (and the
/// plan made again under it) when something will be written.
fn execute(
    ctx: &Ctx,
    subject: &Subject<'_>,
    how: How,
    systemd: &HostSystemd<'_>,
    make_plan: &dyn Fn() -> Result<Plan>,
) -> Result<()> {
    let dry_run = how.dry_run;
    let mut plan = make_plan()?;
    let mut _lock = None;
    if !dry_run && plan.changes() > 0 {
        _lock = Some(match subject {
            Subject::Machine(machine) => {
                let timeout = ctx.config.machine(&ctx.host, machine)?.lock_timeout;
                lock::lock(&ctx.host, machine, timeout)?
            }
            Subject::Host => lock::lock_host(&ctx.host, ctx.config.host()?.lock_timeout)?,
        });
        plan = make_plan()?;
    }
    let mut reload_needed = plan.needs_reload();
    let mut owed = "";
    if !reload_needed && ctx.host.is_real_root() {
        let unit = match subject {
            Subject::Machine(machine) => unit_name(machine),
            Subject::Host => crate::model::host_unit::UNIT.to_owned(),
        };
        match (systemd.pending)(&unit) {
            Ok(p) => {
                reload_needed = p;
                owed = "; unit files on disk are newer than what systemd loaded";
            }
            // A host without a reachable systemd (an image build) has nothing loaded to update.
            Err(e) => tracing::debug!(%unit, "NeedDaemonReload not known: {e:#}"),
        }
    }
    if !dry_run {
        plan.apply(&ctx.host)?;
    }
    let mut reload_err = None;
    let reload_word = match (reload_needed, dry_run, ctx.host.is_real_root()) {
        (false, _, _) => "not reloaded (no unit file changed)".to_owned(),
        (true, _, false) => format!(
            "not reloaded: --host-root {} is not /; run `systemctl daemon-reload` on that host",
            ctx.host.root().display()
        ),
        (true, true, true) => format!("would reload (daemon-reload{owed})"),
        (true, false, true) => match (systemd.reload)() {
            Ok(()) => format!("reloaded (daemon-reload{owed})"),
            Err(e) => {
                reload_err = Some(e);
                "daemon-reload FAILED; run `systemctl daemon-reload`".to_owned()
            }
        },
    };
    // The report comes before a reload error: the files did change, and a second run would
    // find nothing to do (and so not reload either).
    if how.json {
        let text = serde_json::to_string_pretty(&plan.json(dry_run, &reload_word))
            .context("serializing the report")?;
        crate::output::print_all(&format!("{text}\n"))?;
    } else {
        crate::output::print_all(&plan.report(dry_run, &reload_word))?;
    }
    match reload_err {
        Some(e) => Err(e.context("daemon-reload after changing unit files")),
        None => Ok(()),
    }
}

/// What install or uninstall works on: a machine's hooks, or host mode's units.
enum Subject<'a> {
    Machine(&'a MachineName),
    Host,
}

/// `install <MACHINE>`: see the module docs and docs/wiring.md.
pub fn install(
    ctx: &Ctx,
    machine: &MachineName,
    how: How,
    systemd: &HostSystemd<'_>,
) -> Result<()> {
    let exe =
        std::fs::read("/proc/self/exe").context("reading the running helper /proc/self/exe")?;
    execute(ctx, &Subject::Machine(machine), how, systemd, &|| {
        plan_install(ctx, machine, &exe)
    })
    .with_context(|| format!("install of {machine}"))
}

/// `install <MACHINE> --print-dropin`: the drop-in [`install`] writes for the machine's config,
/// on stdout, so tests and tools take it from the binary instead of keeping a copy that drifts.
pub fn print_dropin(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    crate::output::print_all(
        &Dropin::for_gpus(machine, ctx.config.helper_path(), &mc.gpus).to_string(),
    )
}

/// `uninstall <MACHINE>`: remove what install added, leaving a `.nspawn` file without GPU binds;
/// leaves the rootfs and a running machine alone.
pub fn uninstall(
    ctx: &Ctx,
    machine: &MachineName,
    how: How,
    systemd: &HostSystemd<'_>,
) -> Result<()> {
    execute(ctx, &Subject::Machine(machine), how, systemd, &|| {
        plan_uninstall(ctx, machine)
    })
    .with_context(|| format!("uninstall of {machine}"))
}

mod host;
mod uninstall;

pub use host::{install_host, uninstall_host};
use uninstall::*;

#[cfg(test)]
mod tests;
