//! Apply CDI devices to an OCI runtime config as a CDI-aware runtime does, with the official CDI
//! library (the `container-device-interface` crate): what `tests/gpu/run.sh` uses to give real
//! runc our spec and NVIDIA's, on a host that has nothing of the CDI project installed.
//!
//! ```text
//! cdi_inject --spec-dir DIR [--spec-dir DIR2 ...] --device KIND=NAME [--device ...] IN OUT
//! ```
//!
//! IN is an OCI config (e.g. `runc spec`'s); OUT gets IN with every named device's and every
//! spec's container edits applied (env, device nodes and their cgroup rules, mounts, hooks).
//! Exit 1, naming the cause, when a spec does not load or a device is not found.

use anyhow::{Context as _, Result, anyhow, bail};
use container_device_interface as cdi;
use oci_spec::runtime as oci;
use std::collections::HashMap;

fn main() {
    if let Err(e) = run(std::env::args().skip(1).collect()) {
        eprintln!("cdi_inject: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let mut dirs = Vec::new();
    let mut devices = Vec::new();
    let mut files = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--spec-dir" => dirs.push(it.next().context("--spec-dir needs a directory")?),
            "--device" => devices.push(it.next().context("--device needs KIND=NAME")?),
            _ if a.starts_with('-') => bail!("unknown option {a}"),
            _ => files.push(a),
        }
    }
    let [input, output] = files.as_slice() else {
        bail!("usage: cdi_inject --spec-dir DIR --device KIND=NAME IN OUT");
    };
    if dirs.is_empty() || devices.is_empty() {
        bail!("at least one --spec-dir and one --device are needed");
    }
    let text = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    let mut spec: oci::Spec =
        serde_json::from_slice(&text).with_context(|| format!("{input}: not an OCI config"))?;
    let mut cache = cdi::cache::Cache::new(dirs.clone(), HashMap::new(), HashMap::new());
    // The library's errors are not `Send`: carried over as text.
    cache
        .refresh()
        .map_err(|e| anyhow!("loading the CDI specs in {dirs:?}: {e}"))?;
    cache
        .inject_devices(Some(&mut spec), devices.clone())
        .map_err(|e| anyhow!("injecting {devices:?}: {e}"))?;
    let json = serde_json::to_string_pretty(&spec).context("rendering the config")?;
    std::fs::write(output, json).with_context(|| format!("writing {output}"))?;
    Ok(())
}
