//! pre-start's parts ([`BootPart`], listed by [`crate::apply::executor::pre_start`]): what the
//! machine's next boot binds, made on the host from the rendered `.nspawn` file ([`Rendered`]).
//! Each is one unit, as the wiring's parts are (src/apply/parts/): [`Boot::observe`] reads what
//! the host holds of it (reads only), [`Boot::diff_of`] says what would change (pure), and the
//! apply makes it, re-reading what it is about to write. pre-start applies a part only when its
//! diff is not empty ([`crate::apply::executor::execute_boot`]); `plan` lists the diffs
//! ([`crate::apply::executor::pending_boot`]). The parts live beside their writes: what they
//! read is the host's own tree, which pre-start alone writes.

use crate::Ctx;
use crate::apply::driver_tree;
use crate::apply::executor::{self, BootPart, BootWork, Plan};
use crate::apply::gate;
use crate::config::MachineConfig;
use crate::failpoint::Point;
use crate::model::Change;
use crate::model::device_cgroup;
use crate::model::gate as gates;
use crate::model::host_devices;
use crate::model::layout::{self, Tree};
use crate::model::nspawn::describe_change;
use crate::model::render::Rendered;
use crate::systemd::Systemd;
use crate::types::machine_name::MachineName;
use crate::types::paths::UnitName;
use anyhow::Result;
use std::cell::{OnceCell, RefCell};

mod observe;

/// What pre-start makes for `machine`'s next boot: the rendered file and what it binds.
pub struct Boot<'a> {
    pub ctx: &'a Ctx,
    pub machine: &'a MachineName,
    pub mc: &'a MachineConfig,
    /// The file is the plan's until the driver tree part: a driver file the kernel refuses to
    /// link becomes a bind of the file ([`Boot::driver_tree`]).
    pub rendered: RefCell<Rendered>,
    /// Whether this is the unit's own start, whose boot gets fresh gate markers: under the real
    /// root only then (run by hand, the machine may be running, and its boot keeps its markers);
    /// under `--host-root` always (no machine runs from the tree); `plan` shows a start's.
    in_its_start: bool,
    /// The host's systemd, once reached (the device cgroup's observe and apply).
    bus: OnceCell<Systemd>,
}

impl<'a> Boot<'a> {
    /// pre-start's parts for `machine`, in the unit's own start when `in_its_start`.
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
    pub fn in_its_start(ctx: &Ctx, machine: &MachineName) -> bool {
        !ctx.host.is_real_root() || crate::types::units::runs_in_its_start(machine)
    }

    /// The parts of this machine's start, in order: the device cgroup under the real root
    /// (under `--host-root` there is no unit), the gate's when the file binds it.
    pub fn plan(&self) -> Plan<BootPart> {
        executor::pre_start(self.ctx.host.is_real_root(), self.binds_gate())
    }

    /// The host's systemd, reached at the first call.
    fn bus(&self) -> Result<&Systemd> {
        if let Some(sd) = self.bus.get() {
            return Ok(sd);
        }
        let sd = Systemd::host(std::time::Instant::now() + DBUS_TIMEOUT)?;
        Ok(self.bus.get_or_init(|| sd))
    }
}

impl Boot<'_> {
    /// The host paths the `.nspawn` file binds that pre-start must make first: the empty NVIDIA
    /// node directories ([`host_devices::NVIDIA_NODE_DIRS`], a machine with every GPU) and the
    /// nodes discovery found registered without one; (path, device numbers for a node).
    fn host_nodes(&self) -> Vec<(String, Option<(u32, u32)>)> {
        let rendered = self.rendered.borrow();
        let start = rendered.start();
        let mut out = Vec::new();
        if start.assignment.view.complete_driver().is_some() {
            for (dir, role) in host_devices::NVIDIA_NODE_DIRS {
                if host_devices::nvidia_dir_bound(&start.assignment.setting, role)
                    && !self.ctx.host.is_dir(dir)
                {
                    out.push((dir.to_owned(), None));
                }
            }
        }
        for d in start.devices.iter().filter(|d| d.create) {
            out.push((d.path.to_string(), Some((d.major, d.minor))));
        }
        out
    }

    /// Whether the machine's bpf filesystem ([`host_devices::bpffs_dir`]) is missing: no
    /// directory, or (on the real host, where pre-start mounts) not a bpf filesystem.
    fn bpffs_missing(&self) -> bool {
        let dir = host_devices::bpffs_dir(self.machine);
        match crate::fs::host_dir::check(&self.ctx.host, &dir, 0o700) {
            Err(_) | Ok(None) => true,
            Ok(Some(d)) => {
                self.ctx.host.is_real_root()
                    && !crate::fs::fd_mount::is_bpffs(d.fd()).unwrap_or(false)
            }
        }
    }

    /// The machine's bpf filesystem made: its directory (`0700`), and on the real host a bpf
    /// filesystem mounted there unless one is. Every component is checked as the lock
    /// directory's are (`host_dir`: no link, ours, nobody else may write), so no one but root
    /// decides where the mount goes.
    fn make_bpffs(&self) -> Result<Option<String>> {
        if !self.bpffs_missing() {
            return Ok(None);
        }
        let dir = host_devices::bpffs_dir(self.machine);
        let d = crate::fs::host_dir::open(&self.ctx.host, &dir, 0o700)?;
        let fd = d.fd();
        if self.ctx.host.is_real_root() && !crate::fs::fd_mount::is_bpffs(fd)? {
            crate::fs::fd_mount::mount_bpffs_onto(fd)?;
            return Ok(Some(format!("bpf filesystem mounted at {dir}")));
        }
        Ok(Some(format!("{dir} made")))
    }

    /// Make [`Self::host_nodes`]: directories `0755`, nodes `0666` as udev's rule for
    /// `rdma_cm` makes it; one made meanwhile (udev) is left as it is.
    fn make_host_nodes(&self) -> Result<String> {
        use anyhow::Context as _;
        use nix::sys::stat::{Mode, SFlag, fchmodat, makedev, mknodat};
        let host = &self.ctx.host;
        let mut made = Vec::new();
        for (path, numbers) in self.host_nodes() {
            let Some((major, minor)) = numbers else {
                host.create_dir_all(&path, 0o755)?;
                made.push(path);
                continue;
            };
            let (parent, name) = path.rsplit_once('/').context("a node path has a parent")?;
            let dir = host.create_dir_all(parent, 0o755)?;
            let mode = Mode::from_bits_truncate(0o666);
            let dev = makedev(u64::from(major), u64::from(minor));
            match mknodat(&dir, name, SFlag::S_IFCHR, mode, dev) {
                Ok(()) => {
                    fchmodat(
                        &dir,
                        name,
                        mode,
                        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                    )
                    .with_context(|| format!("chmod {path}"))?;
                    made.push(format!("{path} ({major}:{minor})"));
                }
                Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(e).with_context(|| format!("mknod {path}")),
            }
        }
        made.extend(self.make_bpffs()?);
        Ok(format!("host device nodes made: {}", made.join(" ")))
    }

    /// Whether the file binds the unit gate (its drop-in and the boot's markers).
    fn binds_gate(&self) -> bool {
        self.rendered.borrow().start().file.binds_gate()
    }

    /// The machine's own `DeviceAllow=` entries: its GPUs (a share) or the drop-in's NVIDIA
    /// groups (`all`), and its host devices.
    fn device_entries(&self) -> Vec<(String, String)> {
        let rendered = self.rendered.borrow();
        let start = rendered.start();
        device_cgroup::machine_entries(
            &start.assignment.view,
            &start.assignment.setting,
            &start.devices,
        )
    }

    /// The unit's `DeviceAllow=` as systemd holds it now.
    fn device_allow(&self) -> Result<Vec<(String, String)>> {
        let unit = crate::types::units::unit_name(self.machine);
        let deadline = std::time::Instant::now() + DBUS_TIMEOUT;
        self.bus()?.device_allow(&unit, deadline)
    }

    fn device_cgroup(&self) -> Result<String> {
        let unit = crate::types::units::unit_name(self.machine);
        let current = self.device_allow()?;
        let ours = self.device_entries();
        let new = device_cgroup::merge(&current, &ours);
        if device_cgroup::allows_same(&new, &current) {
            return self.unchanged(BootPart::DeviceCgroup);
        }
        let deadline = std::time::Instant::now() + DBUS_TIMEOUT;
        self.bus()?.set_device_allow(&unit, &new, deadline)?;
        Ok(format!(
            "device cgroup of {unit} set: {} NVIDIA/DRM node(s) of its own: {}",
            ours.len(),
            ours.iter()
                .map(|(p, _)| p.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        ))
    }

    fn gate_file(&self) -> Result<String> {
        Ok(if gate::write_host_file(&self.ctx.host)? {
            format!("unit gate written: {}", gates::HOST_FILE)
        } else {
            self.unchanged(BootPart::GateFile)?
        })
    }

    /// Build (or check) the tree the file binds; without a driver, remove the machine's tree so
    /// it holds no old driver's files. The plan links every file the tree's filesystem can hold
    /// ([`crate::model::tree::plan`]); when the kernel still refuses a link the plan could not
    /// foresee, the file is bound instead and its bind added to the `.nspawn` file: the one way
    /// the file written differs from what `plan` showed, said in a warning.
    fn driver_tree(&self) -> Result<String> {
        let machine = self.machine;
        let dir = layout::tree_host_path(machine);
        let mut r = self.rendered.borrow_mut();
        let start = r.start_mut();
        let Some(plan) = &mut start.tree else {
            return Ok(if driver_tree::remove(&self.ctx.host, machine)? {
                format!("driver tree {dir} removed: no NVIDIA driver for this machine")
            } else {
                NO_TREE.to_owned()
            });
        };
        let built = driver_tree::ensure(&self.ctx.host, machine, plan)?;
        if !built.unlinked.is_empty() {
            let named: Vec<String> = built
                .unlinked
                .iter()
                .map(|(p, e)| format!("{p} ({e})"))
                .collect();
            tracing::warn!(
                %machine, %dir,
                "{} driver files could not be hard-linked into the tree and are bound instead \
                 (the .nspawn file written binds them, which `plan` could not foresee): {}",
                named.len(),
                named.join(", ")
            );
            let tree: Tree = built
                .unlinked
                .iter()
                .filter_map(|(p, _)| plan.tree.get_key_value(p))
                .map(|(p, n)| (p.clone(), n.clone()))
                .collect();
            start.file.bind_driver_files(layout::file_binds(&tree)?);
        }
        tree_line(
            &dir,
            if built.changed { "built" } else { "as planned" },
            plan,
        )
    }

    /// The unit gate's markers for the boot ahead ([`gate::prepare_boot`]): the driver root the
    /// file binds is built and checked, so containerd may start with the boot (unless the config
    /// keeps it for post-start); kubelet waits for post-start. Only in the unit's own start
    /// ([`Boot::new`]): otherwise the part reads nothing and is left as it is.
    fn boot_gate(&self) -> Result<String> {
        if !self.in_its_start {
            return self.unchanged(BootPart::BootGate);
        }
        gate::prepare_boot(&self.ctx.host, self.machine, self.boot_containerd())?;
        Ok(self.boot_gate_line())
    }

    /// What the boot's markers say once made: containerd released for the boot ahead, or both
    /// services waiting for post-start.
    fn boot_gate_line(&self) -> String {
        let dir = gates::machine_marker_dir(self.machine);
        match self.boot_containerd() {
            Some(unit) => format!(
                "unit gate: released {unit} for the boot ahead ({dir}/{unit}): the driver tree \
                 it binds is checked complete"
            ),
            None => format!("unit gate: {dir} emptied; containerd and kubelet wait for post-start"),
        }
    }

    /// The unit the boot ahead releases at once: containerd, unless the config keeps it for
    /// post-start.
    fn boot_containerd(&self) -> Option<&UnitName> {
        self.mc
            .containerd_at_boot
            .then_some(&self.mc.containerd_unit)
    }

    fn nspawn_file(&self) -> Result<String> {
        let r = self.rendered.borrow();
        let new = r.text();
        let shown = r.host_path.display();
        Ok(
            if self.ctx.host.write_if_changed(
                crate::types::units::nspawn_path(self.machine),
                new.as_bytes(),
                0o644,
                Point::PreStartMidNspawnWrite,
            )? {
                format!("{shown}: {}", describe_change(r.old.as_deref(), &new))
            } else {
                format!("{shown}: {UNCHANGED}")
            },
        )
    }
}

impl BootWork for Boot<'_> {
    fn diff(&self, part: BootPart) -> Result<Vec<Change>> {
        Ok(self.diff_of(part, &self.observe(part)?))
    }

    fn unchanged(&self, part: BootPart) -> Result<String> {
        Boot::unchanged(self, part)
    }

    fn apply(&self, part: BootPart) -> Result<String> {
        match part {
            BootPart::HostNodes => self.make_host_nodes(),
            BootPart::DeviceCgroup => self.device_cgroup(),
            BootPart::GateFile => self.gate_file(),
            BootPart::DriverTree => self.driver_tree(),
            BootPart::BootGate => self.boot_gate(),
            BootPart::NspawnFile => self.nspawn_file(),
        }
    }
}

/// The driver tree part's line: `how` (built, as planned) and what it holds.
fn tree_line(dir: &str, how: &str, plan: &crate::model::tree::Plan) -> Result<String> {
    let bound = layout::file_binds(&plan.tree)?.len();
    Ok(format!(
        "driver tree {dir} {how}: {} entries, {bound} bound",
        plan.tree.len()
    ))
}

const NO_TREE: &str = "driver tree: none, no NVIDIA driver for this machine";
const UNCHANGED: &str = "unchanged";

/// How long pre-start waits for the host's systemd to answer.
const DBUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
