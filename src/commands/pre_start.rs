//! `nspawn-lifecycle pre-start <MACHINE>` (ExecStartPre=): render the machine's `.nspawn` file
//! and make pre-start's parts (the host nodes, the device cgroup, the unit gate, the driver
//! tree, the file) with the one executor, each only where its diff says, under the machine's
//! lock.

use crate::Ctx;
use crate::apply::boot::Boot;
use crate::apply::executor::execute_boot;
use crate::fs::lock;
use crate::model::render::{check_rendered, check_startable, render};
use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result};

/// ExecStartPre=: refuse what must not start before the lock, then under the machine's lock
/// render the file and what it binds ([`crate::model::render::Rendered`]) and make them.
pub fn pre_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = check_startable(ctx, machine, None)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let rendered = render(ctx, machine, &mc).with_context(|| format!("pre-start of {machine}"))?;
    check_rendered(ctx, machine, &rendered).with_context(|| format!("pre-start of {machine}"))?;
    let boot = Boot::new(
        ctx,
        machine,
        &mc,
        rendered,
        Boot::in_its_start(ctx, machine),
    );
    execute_boot(&boot.plan(), machine.as_str(), &boot)
}
