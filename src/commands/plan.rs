//! `plan <MACHINE>`: what pre-start would write, and a unified diff against the file on disk.

use crate::Ctx;
use crate::image;
use crate::machine_name::MachineName;
use crate::output::print_all;
use crate::render::render;
use anyhow::Result;

/// `plan`: print what pre-start would write and a unified diff against the file on disk (or,
/// with `json`, one `MachinePlan` object); returns whether the file on disk is already exactly
/// that.
pub fn plan(ctx: &Ctx, machine: &MachineName, json: bool) -> Result<bool> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    image::require(&ctx.host, machine, &mc)?;
    let r = render(ctx, machine, &mc)?;
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
