//! The target's `/etc/ld.so.cache` lists the driver's libraries: `ldconfig` in the target, as a
//! transient unit of its systemd, when a library link changed or the cache does not list them.

use super::{Applied, At, Owner, Part, Running, Wiring};
use crate::model::{Action, Change, Check, ld_cache};
use anyhow::{Context as _, Result};

pub struct LdCache;

impl Part for LdCache {
    type Hook = Running;
    /// Whether the loader cache lists the driver's libraries, or why it cannot be read (an
    /// unreadable cache is what the part holds, not a failure to read it); nothing without a
    /// driver.
    type Seen = Option<Result<bool>>;
    const NAME: &'static str = "ldconfig";
    const KEY: &'static str = "ldconfig";
    const CHECK: Check = Check::LdCache;
    const OWNER: Owner = Owner::PostStart;

    fn observe(&self, at: &At) -> Result<Self::Seen> {
        let d = at.desired;
        Ok(d.driver
            .as_ref()
            .map(|driver| ld_cache::lists_driver(at.target, driver)))
    }

    /// `ldconfig` when a library link changes before it, or the cache does not list the driver.
    fn diff(&self, _: &At, lists: &Self::Seen, earlier: &[Change]) -> Result<Vec<Change>> {
        let Some(lists) = lists else {
            return Ok(Vec::new());
        };
        let links_change = earlier.iter().any(|c| c.check == Check::Links);
        Ok(ld_cache::ldconfig_needed(links_change, lists)
            .map(|why| Change::new(Check::LdCache, Action::Run, "ldconfig".into(), why))
            .into_iter()
            .collect())
    }

    /// `ldconfig` when [`ld_cache::ldconfig_needed`] says so (the decision `status` makes too).
    fn apply(&self, w: &Wiring, library_links_changed: bool) -> Result<Applied> {
        let at = At {
            target: w.root,
            host: w.host,
            desired: w.desired,
        };
        let Some(lists) = self.observe(&at)? else {
            return Ok(Applied::line(
                "ldconfig: no driver, nothing of ours to list".to_owned(),
            ));
        };
        let Some(why) = ld_cache::ldconfig_needed(library_links_changed, &lists) else {
            return Ok(Applied::line(
                "ldconfig: not needed, no library link changed and /etc/ld.so.cache lists the \
                 driver"
                    .to_owned(),
            ));
        };
        let out = w
            .services
            .run(
                "nspawn-lifecycle-ldconfig",
                &["/sbin/ldconfig"],
                None,
                w.mc.job_timeout,
            )
            .with_context(|| format!("ldconfig ({why})"))?;
        out.check("ldconfig")?;
        Ok(Applied::line(format!(
            "ldconfig: done in {:.2}s ({why})",
            out.elapsed.as_secs_f64()
        )))
    }
}
