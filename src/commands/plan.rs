//! `plan <MACHINE>`: what pre-start would write, and a unified diff against the file on disk, or
//! why pre-start would refuse the start.

use crate::Ctx;
use crate::machine_name::MachineName;
use crate::output::print_all;
use crate::render::as_pre_start;
use anyhow::{Context as _, Result};

/// `plan`: print what pre-start would write and a unified diff against the file on disk (or,
/// with `json`, one `MachinePlan` object); returns whether the file on disk is already exactly
/// that. Where pre-start would refuse the start, plan fails with its message and exit code.
pub fn plan(ctx: &Ctx, machine: &MachineName, json: bool) -> Result<bool> {
    let (_, r) = as_pre_start(ctx, machine, &crate::discovery::discover(&ctx.host)?)
        .with_context(|| format!("pre-start would refuse to start {machine}"))?;
    if json {
        print_all(&format!(
            "{}\n",
            serde_json::to_string_pretty(&r.to_json(machine))?
        ))?;
    } else {
        print_all(&r.to_string())?;
    }
    Ok(r.up_to_date())
}
