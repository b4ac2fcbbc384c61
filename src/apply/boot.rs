//! What pre-start's parts work on ([`Boot`], the scene of src/apply/parts/'s [`NextStart`]
//! parts): the machine's next start rendered (its `.nspawn` file and what it binds), made on
//! the host. The parts read what the host holds of it (reads only), diff it (pure) and make
//! it; pre-start applies a part only where its diff is not empty
//! ([`crate::apply::executor::execute_boot`]) and `plan` lists the diffs
//! ([`crate::apply::executor::pending_boot`]). What they read is the host's own tree, which
//! pre-start alone writes.
//!
//! [`NextStart`]: crate::apply::parts::NextStart

use crate::Ctx;
use crate::config::MachineConfig;
use crate::model::render::Rendered;
use crate::systemd::Systemd;
use crate::types::machine_name::MachineName;
use anyhow::Result;
use std::cell::{OnceCell, RefCell};

/// What pre-start makes for `machine`'s next boot: the rendered file and what it binds.
pub struct Boot<'a> {
    pub ctx: &'a Ctx,
    pub machine: &'a MachineName,
    pub mc: &'a MachineConfig,
    /// The file is the plan's until the driver tree part: a driver file the kernel refuses to
    /// link becomes a bind of the file (src/apply/parts/driver_tree.rs).
    pub rendered: RefCell<Rendered>,
    /// Whether this is the unit's own start, whose boot gets fresh gate markers: under the real
    /// root only then (run by hand, the machine may be running, and its boot keeps its markers);
    /// under `--host-root` always (no machine runs from the tree); `plan` shows a start's.
    pub in_its_start: bool,
    /// The host's systemd, once reached (the device cgroup's observe and apply).
    bus: OnceCell<Systemd>,
}

impl<'a> Boot<'a> {
    /// pre-start's scene for `machine`, in the unit's own start when `in_its_start`.
    pub fn new(
        ctx: &'a Ctx,
        machine: &'a MachineName,
        mc: &'a MachineConfig,
        rendered: Rendered,
        in_its_start: bool,
    ) -> Self {
        Boot {
            ctx,
            machine,
            mc,
            rendered: rendered.into(),
            in_its_start,
            bus: OnceCell::new(),
        }
    }

    /// Whether this run is in `machine`'s own start ([`Boot::new`]).
    pub(crate) fn in_its_start(ctx: &Ctx, machine: &MachineName) -> bool {
        !ctx.host.is_real_root() || crate::types::units::runs_in_its_start(machine)
    }

    /// The host's systemd, reached at the first call.
    pub fn bus(&self) -> Result<&Systemd> {
        if let Some(sd) = self.bus.get() {
            return Ok(sd);
        }
        let sd = Systemd::host(std::time::Instant::now() + DBUS_TIMEOUT)?;
        Ok(self.bus.get_or_init(|| sd))
    }

    /// Whether the file binds the unit gate (its drop-in and the boot's markers).
    pub(crate) fn binds_gate(&self) -> bool {
        self.rendered.borrow().start().file.binds_gate()
    }
}

/// How long pre-start waits for the host's systemd to answer.
pub(crate) const DBUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
