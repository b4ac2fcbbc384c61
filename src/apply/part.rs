//! post-start's writes, part by part (src/model/part.rs): each part post-start writes is read
//! again with the model's own `observe` just before it is changed, and changed by what the
//! model's `diff` (or the one function it shares with it) says. A target without a driver has
//! the same parts against a [`Desired`] that holds nothing of ours: they remove what is left.

use crate::apply::executor::{Applied, Work};
use crate::apply::gate;
use crate::apply::images::import_images;
use crate::apply::rewire;
use crate::config::MachineConfig;
use crate::failpoint::Point;
use crate::fs::host::HostRoot;
use crate::fs::machine_root::MachineRoot;
use crate::model::part::{Roots, Seen, Written};
use crate::model::{Desired, Part, Target, driver_root, ld_cache};
use crate::systemd::services::Services;
use crate::types::paths::UnitName;
use anyhow::{Context as _, Result};

/// A target as post-start writes it: its rootfs, the host, its [`Desired`] state and its
/// systemd.
pub struct Wiring<'a> {
    pub machine: &'a str,
    pub mc: &'a MachineConfig,
    pub host: &'a HostRoot,
    pub markers: &'a gate::Markers<'a>,
    pub root: &'a MachineRoot,
    pub desired: &'a Desired,
    pub services: &'a dyn Services,
}

impl Work for Wiring<'_> {
    fn apply(&self, part: Written, library_links_changed: bool) -> Result<Applied> {
        let d = self.desired;
        let line = match part {
            Written::DriverRoot => self.driver_root()?,
            Written::Links => {
                let report = match &d.lib_links {
                    Some(lib) => rewire::lib_links(self.root, lib)?,
                    None => rewire::Report::default(),
                };
                return Ok(Applied {
                    line: report.to_string(),
                    library_links_changed: report.changed(),
                });
            }
            Written::DevChar => dev_char(self.root, d, self.host)?,
            Written::LdCache => self.ldconfig(library_links_changed)?,
            Written::CdiSpec => match &d.spec.bytes {
                Some(_) => rewire::write_cdi(self.root, &d.spec, |n, b| d.spec.conflicts(n, b)),
                None => rewire::remove_spec(self.root, &d.spec.dir, &d.spec.file),
            }?
            .to_string(),
        };
        Ok(Applied {
            line,
            library_links_changed: false,
        })
    }

    fn release(&self, unit: &UnitName, point: Point) -> Result<String> {
        Ok(if self.markers.release(unit, point)? {
            format!("unit gate: released {unit} ({})", self.markers.path(unit))
        } else {
            format!("unit gate: {unit} already released")
        })
    }

    fn import(&self) -> Result<(usize, usize)> {
        import_images(self.machine, self.root, self.mc, self.services)
    }
}

/// The `/dev/char` part: with a driver the directory is made and holds a link for each NVIDIA
/// node; without one, ours are removed where it is. (`refresh-devices` makes this part alone.)
/// A machine's links are never written into the host's `/dev` filesystem (the real host's
/// devtmpfs, where the directories bound into machines live; a host tree under `--host-root`
/// and a rootfs on disk share one filesystem by construction and have no such directories).
pub fn dev_char(root: &MachineRoot, d: &Desired, host: &HostRoot) -> Result<String> {
    let host_dev = match d.target {
        Target::Machine if host.is_real_root() => host
            .metadata("/dev")
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m)),
        Target::Machine | Target::Host => None,
    };
    Ok(rewire::dev_char(root, &d.dev_char, d.driver.is_some(), host_dev)?.to_string())
}

impl Wiring<'_> {
    fn roots(&self) -> Roots<'_> {
        Roots {
            target: self.root,
            host: self.host,
        }
    }

    /// The driver root: a machine's nspawn binds, checked file by file against the host's
    /// driver (a mismatch fails the start and makes the next pre-start rebuild the tree:
    /// [`crate::apply::driver_tree::distrust`]); without a driver, what is left of one removed.
    /// Host mode's driver root is the host's own install: nothing to do.
    fn driver_root(&self) -> Result<String> {
        let d = self.desired;
        if d.target == Target::Host {
            return Ok("driver root: the host's own install".to_owned());
        }
        let Some(want) = &d.driver_root else {
            return Ok(rewire::remove_driver_root(self.root)?.to_string());
        };
        let seen = driver_root::observe(self.root, want)?;
        if let Some(why) = driver_root::diff(want, &seen).message(want) {
            return Err(crate::apply::driver_tree::distrust(
                self.host,
                self.machine,
                anyhow::anyhow!(why),
            ));
        }
        Ok(format!(
            "driver root: {} binds of driver {} checked against the host",
            want.len(),
            d.driver.as_ref().map_or("?", |v| v.version.as_str())
        ))
    }

    /// `ldconfig` in the target when [`ld_cache::ldconfig_needed`] says so (the decision
    /// `status` makes too), as a transient unit of its systemd.
    fn ldconfig(&self, library_links_changed: bool) -> Result<String> {
        let lists = match Part::LdCache.observe(&self.roots(), self.desired)? {
            Seen::LdCache(lists) => lists,
            _ => return Ok("ldconfig: no driver, nothing of ours to list".to_owned()),
        };
        let Some(why) = ld_cache::ldconfig_needed(library_links_changed, &lists) else {
            return Ok(
                "ldconfig: not needed, no library link changed and /etc/ld.so.cache lists the \
                 driver"
                    .to_owned(),
            );
        };
        let out = self
            .services
            .run(
                "nspawn-lifecycle-ldconfig",
                &["/sbin/ldconfig"],
                None,
                self.mc.job_timeout,
            )
            .with_context(|| format!("ldconfig ({why})"))?;
        out.check("ldconfig")?;
        Ok(format!(
            "ldconfig: done in {:.2}s ({why})",
            out.elapsed.as_secs_f64()
        ))
    }
}
