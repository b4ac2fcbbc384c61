//! `nspawn-lifecycle post-start`.

use crate::Ctx;
use crate::machine_name::MachineName;
use anyhow::Result;

pub fn post_start(_ctx: &Ctx, machine: &MachineName) -> Result<()> {
    anyhow::bail!("post-start of {machine} is not built yet")
}
