//! `nspawn-lifecycle pre-start`, `plan` and `discover`: everything before a machine starts.

use crate::Ctx;
use crate::atomic::write_if_changed;
use crate::config::Gpus;
use crate::config::MachineConfig;
use crate::device_cgroup;
use crate::discovery::assign::{self, Assignment};
use crate::discovery::{self, Inventory, Verdict};
use crate::error::{Kind, classified};
use crate::failpoint::Point;
use crate::gate;
use crate::image;
use crate::lock;
use crate::machine_name::MachineName;
use crate::nspawn::{NspawnFile, describe_change, nspawn_path};
use anyhow::{Context as _, Result};
use std::fmt::Write as _;

/// The `.nspawn` file as pre-start would write it, beside what is on disk.
#[derive(Debug)]
pub struct Rendered {
    pub host_path: std::path::PathBuf,
    pub old: Option<String>,
    pub new: String,
    /// Whether `new` binds the unit gate (src/gate.rs), whose host file must then exist.
    pub gate: bool,
    /// The driver tree `new` binds (src/driver_tree.rs), whose host copy must then exist.
    pub tree: Option<crate::driver_tree::Plan>,
    /// `new` as a value: pre-start adds the binds of files the tree could not link.
    pub file: NspawnFile,
    /// The machine's share of the host's GPUs (the config's `gpus`).
    pub assignment: Assignment,
}

/// Discover the host and render `machine`'s `.nspawn` file; incomplete NVIDIA state is an error
/// with exit code 3 that names every missing or mismatched piece.
pub fn render(ctx: &Ctx, machine: &MachineName, mc: &MachineConfig) -> Result<Rendered> {
    let inv = discovery::discover(&ctx.host)?;
    let assignment = assign::for_machine(&ctx.config, machine, mc, &inv)?;
    check_complete(&assignment.view)?;
    let has_lib_modules = ctx.host.path("/lib/modules").is_dir();
    let mut file = NspawnFile::render(
        machine,
        &assignment.view,
        mc,
        has_lib_modules,
        ctx.config.helper_path(),
    )?;
    if assignment.setting != Gpus::All {
        file.summary = format!(
            "{} ({} of the host's {} by the config's gpus)",
            file.summary,
            assignment.gpus.len(),
            inv.gpus.len()
        );
    }
    let tree = assignment
        .view
        .complete_driver()
        .map(|d| crate::driver_tree::plan(&ctx.host, d))
        .transpose()?;
    if let Some(plan) = &tree {
        file.bind_driver_files(crate::layout::file_binds(&plan.tree)?);
    }
    let (new, gate) = (file.to_string(), file.binds_gate());
    let host_path = ctx.host.path(nspawn_path(machine));
    let old = match std::fs::read(&host_path) {
        Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", host_path.display())),
    };
    Ok(Rendered {
        host_path,
        old,
        new,
        gate,
        tree,
        file,
        assignment,
    })
}

/// Most reasons one error names; the rest are counted. A real host has a handful, but a /dev
/// full of stale nodes has one per node, and the error is one journal line.
const MAX_REASONS_SHOWN: usize = 10;

/// Fail with exit code 3 when the verdict is incomplete.
pub fn check_complete(inv: &Inventory) -> Result<()> {
    match &inv.verdict {
        Verdict::Incomplete { reasons } => {
            let mut shown = reasons
                .iter()
                .take(MAX_REASONS_SHOWN)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("; ");
            if let Some(more) = reasons.len().checked_sub(MAX_REASONS_SHOWN)
                && more > 0
            {
                let _ = write!(shown, "; and {more} more (`discover` lists every one)");
            }
            Err(classified(
                Kind::DriverIncomplete,
                format!(
                    "NVIDIA state on the host is incomplete, refusing to start until it is: {shown}"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// ExecStartPre=: render and write the `.nspawn` file under the machine's lock.
pub fn pre_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    // Before the lock: a mistyped name or a shifted rootfs writes nothing, not even the lock file.
    image::require(&ctx.host, machine, &mc)?;
    // Two machines given one GPU is bad config, refused before the lock is made too; render
    // checks again under the lock, against the host as it is then.
    // Only lists can overlap: with fewer than two, the host is not scanned a second time.
    let lists = ctx.config.gpu_assignments(machine)?;
    if assign::lists_can_overlap(&lists) {
        assign::check_overlap(&discovery::discover(&ctx.host)?, &lists)?;
    }
    check_installed_dropin(ctx, machine, &mc.gpus)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let mut r = render(ctx, machine, &mc).with_context(|| format!("pre-start of {machine}"))?;
    set_device_cgroup(ctx, machine, &r.assignment)
        .with_context(|| format!("pre-start of {machine}: device cgroup"))?;
    // The bind's source first: nspawn refuses to start when it is missing.
    if r.gate && gate::write_host_file(&ctx.host)? {
        tracing::info!(%machine, file = gate::HOST_FILE, "unit gate written");
    }
    crate::driver_tree::apply(&ctx.host, machine.as_str(), &mut r)?;
    if write_if_changed(
        &r.host_path,
        r.new.as_bytes(),
        0o644,
        Point::PreStartMidNspawnWrite,
    )? {
        tracing::info!(
            %machine,
            file = %r.host_path.display(),
            "{}",
            describe_change(r.old.as_deref(), &r.new)
        );
    } else {
        tracing::info!(%machine, file = %r.host_path.display(), "unchanged");
    }
    Ok(())
}

/// The installed drop-in must be the one for the machine's `gpus` (exit 2 until `install`).
/// For a machine without every GPU, the unit's `DeviceAllow=`: its own nodes, by number,
/// at every start (src/device_cgroup.rs). Only on the real host: a `--host-root` tree has no
/// systemd of its own to ask.
fn check_installed_dropin(ctx: &Ctx, machine: &MachineName, gpus: &Gpus) -> Result<()> {
    let dropin = crate::units::dropin_path(machine);
    match std::fs::read_to_string(ctx.host.path(&dropin)) {
        Ok(text) => device_cgroup::check_dropin(machine.as_str(), &dropin, &text, gpus),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("reading {dropin}")),
    }
}

fn set_device_cgroup(ctx: &Ctx, machine: &MachineName, a: &Assignment) -> Result<()> {
    // `all`: the drop-in's device groups, as always.
    if a.setting == Gpus::All || !ctx.host.is_real_root() {
        return Ok(());
    }
    let unit = crate::units::unit_name(machine);
    let deadline = std::time::Instant::now() + DBUS_TIMEOUT;
    let sd = crate::systemd::Systemd::host(deadline)?;
    let current = sd.device_allow(&unit, deadline)?;
    let ours = device_cgroup::machine_entries(&a.view);
    let new = device_cgroup::merge(&current, &ours);
    if new == current {
        tracing::info!(%machine, %unit, "device cgroup unchanged: {} NVIDIA/DRM node(s)", ours.len());
        return Ok(());
    }
    sd.set_device_allow(&unit, &new, deadline)?;
    tracing::info!(
        %machine,
        %unit,
        "device cgroup set: {} NVIDIA/DRM node(s) of its own: {}",
        ours.len(),
        ours.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>().join(" ")
    );
    Ok(())
}

/// How long pre-start waits for the host's systemd to answer.
const DBUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `plan`: print what pre-start would write and a unified diff against the file on disk.
pub fn plan(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    image::require(&ctx.host, machine, &mc)?;
    let r = render(ctx, machine, &mc)?;
    print_all(&plan_text(&r))
}

fn plan_text(r: &Rendered) -> String {
    let shown = r.host_path.display().to_string();
    // `all` (the default) shows nothing new: every GPU, as before the setting existed.
    let mut out = match r.assignment.setting {
        Gpus::All => String::new(),
        _ => format!(
            "# GPUs (the config's gpus): {}\n# Device cgroup (runtime DeviceAllow=, set by pre-start): {}\n",
            r.assignment.summary(),
            match device_cgroup::machine_entries(&r.assignment.view) {
                e if e.is_empty() => "no NVIDIA or DRM node".to_owned(),
                e => e
                    .iter()
                    .map(|(p, a)| format!("{p} {a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        ),
    };
    let _ = write!(out, "# {shown} as pre-start would write it:\n{}\n", r.new);
    match &r.old {
        Some(old) if *old == r.new => out.push_str(&format!("# {shown} is up to date.\n")),
        old => {
            let old_text = old.as_deref().unwrap_or("");
            let from = if old.is_some() {
                format!("{shown} (on disk)")
            } else {
                format!("{shown} (missing)")
            };
            let diff = similar::TextDiff::from_lines(old_text, &r.new);
            let _ = write!(
                out,
                "{}",
                diff.unified_diff()
                    .header(&from, &format!("{shown} (pre-start)"))
            );
        }
    }
    out
}

/// `discover`: print what discovery sees.
pub fn discover(ctx: &Ctx, json: bool) -> Result<()> {
    let inv = discovery::discover(&ctx.host)?;
    let settings = ctx.config.gpu_settings()?;
    let lists: Vec<(String, Gpus)> = settings
        .iter()
        .map(|(m, g, _)| (m.clone(), g.clone()))
        .collect();
    assign::check_overlap(&inv, &lists)?;
    // `all` machines get the whole inventory above; the others are shown one by one.
    let assignments: Vec<_> = settings
        .iter()
        .filter(|(_, g, _)| *g != Gpus::All)
        .map(|(m, g, require)| (m, assign::assign(&inv, g), *require))
        .collect();
    if json {
        let mut report = discovery::Report::new(&ctx.host, &inv);
        report.assignments = assignments
            .iter()
            .map(|(m, a, require)| a.report(m, *require))
            .collect();
        print_all(&format!("{}\n", serde_json::to_string_pretty(&report)?))
    } else {
        let mut text = discovery_text(&inv);
        for (m, a, _) in &assignments {
            let _ = writeln!(text, "machine {m}: gpus {}", a.summary());
        }
        print_all(&text)
    }
}

/// Human-readable discovery report.
pub fn discovery_text(inv: &Inventory) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "verdict: {}",
        match &inv.verdict {
            Verdict::None => "none (no NVIDIA device nodes; GPU work is skipped)".to_owned(),
            Verdict::Complete => "complete".to_owned(),
            Verdict::Incomplete { reasons } => format!("incomplete: {}", reasons.join("; ")),
        }
    );
    let _ = writeln!(
        s,
        "kernel module: {}",
        inv.kernel_module.as_deref().unwrap_or("not loaded")
    );
    let _ = writeln!(
        s,
        "userspace driver: {}",
        inv.driver
            .as_ref()
            .map_or("not found", |d| d.version.as_str())
    );
    let _ = writeln!(s, "gpus: {}", inv.gpus.len());
    for g in &inv.gpus {
        let _ = writeln!(
            s,
            "  {} minor {} {} {} {} {}{}",
            g.index,
            g.minor,
            g.uuid,
            g.bus_id,
            g.model,
            g.device.as_deref().unwrap_or("(no device node)"),
            if g.dri.is_empty() {
                String::new()
            } else {
                format!(" {}", g.dri.join(" "))
            }
        );
    }
    let _ = writeln!(s, "device nodes: {}", inv.devices.len());
    for d in &inv.devices {
        let _ = writeln!(s, "  {} {}:{} {:?}", d.path, d.major, d.minor, d.role);
    }
    let _ = writeln!(
        s,
        "kvm: {}",
        inv.kvm.as_ref().map_or("absent".to_owned(), |k| format!(
            "{} {}:{}",
            k.path, k.major, k.minor
        ))
    );
    if let Some(d) = &inv.driver {
        for dir in &d.lib_dirs {
            let _ = writeln!(
                s,
                "library dir: {} ({}, {} files)",
                dir.path,
                dir.triplet,
                dir.files.len()
            );
            for f in &dir.files {
                let _ = writeln!(
                    s,
                    "  {}{}",
                    f.name,
                    f.soname
                        .as_ref()
                        .map_or(String::new(), |so| format!(" (SONAME {so})"))
                );
            }
        }
        for b in &d.binaries {
            let _ = writeln!(s, "binary: {b}");
        }
        let _ = writeln!(s, "firmware: {}", d.firmware.as_deref().unwrap_or("absent"));
        for sock in &d.sockets {
            let _ = writeln!(s, "ipc: {sock}");
        }
    }
    s
}

/// Print to stdout; a reader that went away (`demo | head`) is not an error.
pub(crate) fn print_all(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing to standard output")
        }
        _ => Ok(()),
    }
}
