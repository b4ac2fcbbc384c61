//! A machine's start must fit the unit's start timeout, or systemd kills post-start mid-way.

use super::MachineConfig;
use crate::error::bad_input;
use anyhow::Result;

/// The unit's start timeout, which the drop-in sets (`TimeoutStartSec=`,
/// [`crate::model::dropin::TIMEOUT_START`] is this text): a start's worst case must fit.
pub const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// [`START_TIMEOUT`] as systemd reads it.
pub const START_TIMEOUT_TEXT: &str = "30min";

/// A start's worst case must fit the unit's start timeout, or systemd kills post-start mid-way
/// (mid-import, the gate shut): the lock wait, the boot, six service jobs (stop and start of
/// containerd and kubelet, their waits) and the whole import budget.
pub(super) fn check_start_fits(key: &str, mc: &MachineConfig) -> Result<()> {
    let worst = mc.lock_timeout + mc.boot_timeout + 6 * mc.job_timeout + mc.import_budget;
    if worst > START_TIMEOUT {
        return Err(bad_input(format!(
            "{key}: lockTimeoutSeconds ({}) + bootTimeoutSeconds ({}) + 6 × jobTimeoutSeconds \
             ({}) + importBudgetSeconds ({}) is {} s, more than the unit's \
             TimeoutStartSec={} ({} s): systemd would kill post-start mid-way; lower \
             importBudgetSeconds (or the others)",
            mc.lock_timeout.as_secs(),
            mc.boot_timeout.as_secs(),
            mc.job_timeout.as_secs(),
            mc.import_budget.as_secs(),
            worst.as_secs(),
            START_TIMEOUT_TEXT,
            START_TIMEOUT.as_secs()
        )));
    }
    Ok(())
}
