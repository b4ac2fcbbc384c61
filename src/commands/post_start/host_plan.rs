//! `host plan`: what `host post-start` would do on this host now.

use crate::Ctx;
use crate::apply::executor::{Order, plan, plan_without_gpus};
use crate::apply::gate;
use crate::discovery::{self, check_complete};
use crate::fs::lock;
use crate::fs::machine_root::MachineRoot;
use crate::model::Target;
use crate::model::cdi;
use crate::model::gate as gates;
use anyhow::{Context as _, Result};

/// `host plan`: what `host post-start` would do on this host now, from the same
/// values it runs ([`plan`] of [`Target::Host`], the host settings, discovery). Writes nothing;
/// works under `--host-root`. Text, or with `json` one object (kind `HostPlan`). Exit 3, after
/// the report, while the NVIDIA state is incomplete.
pub fn host_plan(ctx: &Ctx, json: bool) -> Result<()> {
    let hc = ctx.config.host()?;
    let inv = discovery::discover(&ctx.host)?;
    let spec = cdi::spec_on_host(&inv, &hc.cdi_kind, ctx.config.helper_path().as_str())?;
    let root = MachineRoot::open(ctx.host.root())?;
    let mut units = Vec::new();
    for unit in [&hc.containerd_unit, &hc.kubelet_unit] {
        units.push(HostPlanUnit {
            unit: unit.to_string(),
            gate_dropin: gates::host_dropin(unit).to_string(),
            gate_installed: gates::is_gated_on_host(&root, unit)?,
            marker: gates::marker(unit).to_string(),
            released: gate::Markers::of_host(&ctx.host).is_released(unit)?,
        });
    }
    let complete = check_complete(&inv).context("host plan");
    let gated = units.iter().any(|u| u.gate_installed);
    let (nvidia, steps) = match (inv.complete_driver(), &spec) {
        _ if complete.is_err() => ("incomplete", None),
        (Some(_), Some(_)) => ("complete", Some(plan(&hc, Target::Host, Order::Gated))),
        _ => ("none", Some(plan_without_gpus(&hc, Target::Host, gated))),
    };
    let steps = steps.map_or_else(Vec::new, |p| {
        p.steps.iter().map(ToString::to_string).collect()
    });
    let value = HostPlan {
        api_version: discovery::API_VERSION,
        kind: "HostPlan",
        host_root: ctx.host.root().display().to_string(),
        lock: format!("{}/{}", lock::LOCK_DIR, lock::HOST_LOCK_NAME),
        units,
        nvidia,
        driver_version: inv.complete_driver().map(|d| d.version.clone()),
        gpus: inv.gpus.len(),
        cdi_spec: format!("{}/{}", hc.cdi_dir, cdi::spec_file_name(&hc.cdi_kind)),
        hook: ctx.config.helper_path().to_string(),
        staged_images: hc.staged_images_dir.to_string(),
        steps,
    };
    let out = if json {
        format!("{}\n", serde_json::to_string_pretty(&value)?)
    } else {
        value.to_string()
    };
    crate::output::print_all(&out)?;
    complete
}

/// What `host plan` shows: one value, printed as text or as JSON (kind `HostPlan`).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HostPlan {
    api_version: &'static str,
    kind: &'static str,
    host_root: String,
    lock: String,
    /// containerd's, then kubelet's.
    units: Vec<HostPlanUnit>,
    /// `complete` (host post-start wires the driver), `incomplete` (it refuses, exit 3) or
    /// `none` (it removes our state).
    nvidia: &'static str,
    driver_version: Option<String>,
    gpus: usize,
    cdi_spec: String,
    hook: String,
    staged_images: String,
    /// post-start's steps in order (without GPUs, the same parts against nothing of ours);
    /// empty while `nvidia` is `incomplete`.
    steps: Vec<String>,
}

/// A host unit and its gate, as `host plan` shows it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HostPlanUnit {
    unit: String,
    gate_dropin: String,
    gate_installed: bool,
    marker: String,
    released: bool,
}

impl std::fmt::Display for HostPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "host mode on {} (the host's systemd)\nlock: {}",
            self.host_root, self.lock
        )?;
        for u in &self.units {
            writeln!(
                f,
                "{}: gate drop-in {} ({}), marker {}{}",
                u.unit,
                u.gate_dropin,
                if u.gate_installed {
                    "installed"
                } else {
                    "not installed"
                },
                u.marker,
                if u.released { " (exists)" } else { "" }
            )?;
        }
        match self.nvidia {
            "incomplete" => writeln!(
                f,
                "NVIDIA state incomplete: host post-start refuses (exit 3) and changes nothing"
            ),
            "complete" => writeln!(
                f,
                "NVIDIA driver {} (driver root /), {} GPU(s)\nCDI spec: {} (hooks run {})\n\
                 staged images: {}\nsteps: {}",
                self.driver_version.as_deref().unwrap_or_default(),
                self.gpus,
                self.cdi_spec,
                self.hook,
                self.staged_images,
                self.steps.join(" → ")
            ),
            _ => writeln!(
                f,
                "no NVIDIA GPUs: remove our /dev/char links and {}; if the gate drop-ins are \
                 installed, release both and start {}\nsteps: {}",
                self.cdi_spec,
                self.units
                    .iter()
                    .map(|u| u.unit.as_str())
                    .collect::<Vec<_>>()
                    .join(" and "),
                self.steps.join(" → ")
            ),
        }
    }
}
