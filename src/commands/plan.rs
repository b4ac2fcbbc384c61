//! `plan <MACHINE>`: what pre-start would write, and a unified diff against the file on disk, or
//! why pre-start would refuse the start; what pre-start's parts would change on the host (their
//! diffs, the ones pre-start applies); and, for a running machine, what post-start run now
//! would change in it (the wiring model's diff, the one `status` judges).

use crate::Ctx;
use crate::apply::boot::Boot;
use crate::apply::executor::{boot_plan, pending_boot};
use crate::apply::parts;
use crate::model::Change;
use crate::model::render::{Rendered, as_pre_start};
use crate::output::print_all;
use crate::systemd::{MachineHandle, Systemd};
use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result};
use std::time::{Duration, Instant};

/// How long the bus reads for a running machine may take.
const BUS_TIMEOUT: Duration = Duration::from_secs(15);

/// `plan`: print what pre-start would write and a unified diff against the file on disk, what
/// pre-start's parts would change on the host at the unit's next start, and for a running
/// machine what post-start would change in it now (or, with `json`, one `MachinePlan` object);
/// returns whether the file on disk is already exactly that. Where pre-start would refuse the
/// start, plan fails with its message and exit code.
pub fn plan(ctx: &Ctx, machine: &MachineName, json: bool) -> Result<bool> {
    let (mc, r) = as_pre_start(ctx, machine, &crate::discovery::discover(&ctx.host)?)
        .with_context(|| format!("pre-start would refuse to start {machine}"))?;
    // What the unit's own start would find: its parts' diffs, read now (reads only).
    let boot = Boot::new(ctx, machine, &mc, r, true);
    let pre = pending_boot(&boot_plan(&boot), &boot);
    let r = boot.rendered.into_inner();
    let now = post_start_now(ctx, machine, &r);
    if json {
        let mut v = r.to_json(machine);
        v["preStart"] = serde_json::json!({ "changes": pre });
        v["postStart"] = match &now {
            Ok(None) => serde_json::Value::Null,
            Ok(Some(changes)) => serde_json::json!({ "changes": changes }),
            Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
        };
        print_all(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
    } else {
        print_all(&format!(
            "{r}{}{}",
            pre_start_text(&pre),
            post_start_text(machine, &now)
        ))?;
    }
    Ok(r.up_to_date())
}

/// The text of pre-start's list: what its parts would change on the host at the next start.
fn pre_start_text(changes: &[Change]) -> String {
    changes_text("pre-start at the next start (on the host)", changes)
}

/// `# <head>: nothing to change.`, or the number of changes and one line each.
fn changes_text(head: &str, changes: &[Change]) -> String {
    if changes.is_empty() {
        return format!("# {head}: nothing to change.\n");
    }
    let mut out = format!("# {head}: {} change(s):\n", changes.len());
    for c in changes {
        out.push_str(&format!("#   {c}\n"));
    }
    out
}

/// What would change in `machine` when it runs ([`parts::pending`]: every part, through its
/// leader's root): `None` when it is not running, or under `--host-root` (no machine is
/// reachable there). Reads only.
fn post_start_now(ctx: &Ctx, machine: &MachineName, r: &Rendered) -> Result<Option<Vec<Change>>> {
    if !ctx.host.is_real_root() {
        return Ok(None);
    }
    let deadline = Instant::now() + BUS_TIMEOUT;
    let host = Systemd::host(deadline)?;
    if host.machine_leader(machine, deadline)?.is_none() {
        return Ok(None);
    }
    let handle = MachineHandle::find(&host, machine, deadline)?;
    let at = parts::At {
        target: handle.root(),
        host: &ctx.host,
        desired: &r.desired,
    };
    Ok(Some(parts::pending(&at)))
}

/// The text of [`post_start_now`].
fn post_start_text(machine: &MachineName, now: &Result<Option<Vec<Change>>>) -> String {
    match now {
        Ok(None) => String::new(),
        Ok(Some(changes)) => {
            changes_text(&format!("post-start now ({machine} is running)"), changes)
        }
        Err(e) => format!("# post-start now: {machine} could not be read: {e:#}\n"),
    }
}

/// `cdi-spec <MACHINE>`: the CDI spec post-start writes in the machine for the host as it is now
/// (the desired state's, as pre-start would start it), or with `list` its device names
/// (`kind=name`). Nothing when the machine gets no spec. Writes nothing.
pub fn cdi_spec(ctx: &Ctx, machine: &MachineName, list: bool) -> Result<()> {
    let (_, r) = as_pre_start(ctx, machine, &crate::discovery::discover(&ctx.host)?)
        .with_context(|| format!("pre-start would refuse to start {machine}"))?;
    let want = &r.desired.spec;
    let Some(bytes) = &want.bytes else {
        tracing::info!(%machine, "no CDI spec: the machine gets no GPU");
        return Ok(());
    };
    if !list {
        return print_all(&String::from_utf8_lossy(bytes));
    }
    let checked = crate::model::cdi::check(&want.kind, bytes)
        .map_err(|e| anyhow::anyhow!("the CDI spec of {machine}: {e}"))?;
    let names: String = checked
        .devices
        .iter()
        .map(|(name, _)| format!("{}={name}\n", want.kind))
        .collect();
    print_all(&names)
}
