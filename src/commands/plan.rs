//! `plan <MACHINE>`: what pre-start would write, and a unified diff against the file on disk.

use crate::Ctx;
use crate::image;
use crate::machine_name::MachineName;
use crate::output::print_all;
use crate::render::render;
use anyhow::Result;

/// `plan`: print what pre-start would write and a unified diff against the file on disk;
/// returns whether the file on disk is already exactly that.
pub fn plan(ctx: &Ctx, machine: &MachineName) -> Result<bool> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    image::require(&ctx.host, machine, &mc)?;
    let r = render(ctx, machine, &mc)?;
    print_all(&r.to_string())?;
    Ok(r.old.as_deref() == Some(r.text().as_str()))
}
