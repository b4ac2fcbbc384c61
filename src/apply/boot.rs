//! pre-start's work ([`Boot`]): what the machine's next boot binds, made on the host from the
//! rendered `.nspawn` file ([`Rendered`]), one file step of [`crate::apply::executor::pre_start`]'s
//! plan at a time.

use crate::Ctx;
use crate::apply::driver_tree;
use crate::apply::executor::{BootStep, BootWork};
use crate::apply::gate;
use crate::config::MachineConfig;
use crate::failpoint::Point;
use crate::model::device_cgroup;
use crate::model::gate as gates;
use crate::model::host_devices;
use crate::model::layout::{self, Tree};
use crate::model::nspawn::describe_change;
use crate::model::render::Rendered;
use crate::types::machine_name::MachineName;
use anyhow::Result;
use std::cell::RefCell;

/// What pre-start makes for `machine`'s next boot: the rendered file and what it binds.
pub struct Boot<'a> {
    pub ctx: &'a Ctx,
    pub machine: &'a MachineName,
    pub mc: &'a MachineConfig,
    /// The file is the plan's until the driver tree step: a driver file the kernel refuses to
    /// link becomes a bind of the file ([`Boot::driver_tree`]).
    pub rendered: RefCell<Rendered>,
}

impl Boot<'_> {
    /// Whether pre-start sets the machine's device cgroup: its GPUs (a share) or the drop-in's
    /// NVIDIA groups (`all`), and its host devices; under `--host-root` there is no unit.
    pub fn sets_device_cgroup(&self) -> bool {
        self.ctx.host.is_real_root()
    }

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

    /// Whether [`BootStep::HostNodes`] has anything to make.
    pub fn makes_host_nodes(&self) -> bool {
        !self.host_nodes().is_empty() || self.bpffs_missing()
    }

    /// Whether the machine's bpf filesystem ([`host_devices::bpffs_dir`]) is missing: no
    /// directory, or (on the real host, where pre-start mounts) not a bpf filesystem.
    fn bpffs_missing(&self) -> bool {
        let dir = host_devices::bpffs_dir(self.machine.as_str());
        match self.ctx.host.open_dir_no_symlinks(&dir) {
            Err(_) => true,
            Ok(fd) => {
                self.ctx.host.is_real_root() && !crate::fs::fd_mount::is_bpffs(&fd).unwrap_or(false)
            }
        }
    }

    /// The machine's bpf filesystem made: its directory (`0700`), and on the real host a bpf
    /// filesystem mounted there unless one is.
    fn make_bpffs(&self) -> Result<Option<String>> {
        if !self.bpffs_missing() {
            return Ok(None);
        }
        let dir = host_devices::bpffs_dir(self.machine.as_str());
        let fd = self.ctx.host.create_dir_all(&dir, 0o700)?;
        if self.ctx.host.is_real_root() && !crate::fs::fd_mount::is_bpffs(&fd)? {
            crate::fs::fd_mount::mount_bpffs_onto(&fd)?;
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
    pub fn binds_gate(&self) -> bool {
        self.rendered.borrow().start().file.binds_gate()
    }

    fn device_cgroup(&self) -> Result<String> {
        let machine = self.machine;
        let unit = crate::types::units::unit_name(machine);
        let deadline = std::time::Instant::now() + DBUS_TIMEOUT;
        let sd = crate::systemd::Systemd::host(deadline)?;
        let current = sd.device_allow(&unit, deadline)?;
        let rendered = self.rendered.borrow();
        let start = rendered.start();
        let ours = device_cgroup::machine_entries(
            &start.assignment.view,
            &start.assignment.setting,
            &start.devices,
        );
        let new = device_cgroup::merge(&current, &ours);
        if new == current {
            return Ok(format!(
                "device cgroup of {unit} unchanged: {} NVIDIA/DRM node(s)",
                ours.len()
            ));
        }
        sd.set_device_allow(&unit, &new, deadline)?;
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
            format!("unit gate: {} as it must be", gates::HOST_FILE)
        })
    }

    /// Build (or check) the tree the file binds; without a driver, remove the machine's tree so
    /// it holds no old driver's files. The plan links every file the tree's filesystem can hold
    /// ([`crate::model::tree::plan`]); when the kernel still refuses a link the plan could not
    /// foresee, the file is bound instead and its bind added to the `.nspawn` file: the one way
    /// the file written differs from what `plan` showed, said in a warning.
    fn driver_tree(&self) -> Result<String> {
        let machine = self.machine.as_str();
        let dir = layout::tree_host_path(machine);
        let mut r = self.rendered.borrow_mut();
        let start = r.start_mut();
        let Some(plan) = &mut start.tree else {
            return Ok(if driver_tree::remove(&self.ctx.host, machine)? {
                format!("driver tree {dir} removed: no NVIDIA driver for this machine")
            } else {
                "driver tree: none, no NVIDIA driver for this machine".to_owned()
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
        let bound = layout::file_binds(&plan.tree)?.len();
        Ok(format!(
            "driver tree {dir} {}: {} entries, {bound} bound",
            if built.changed { "built" } else { "as planned" },
            plan.tree.len()
        ))
    }

    /// The unit gate's markers for the boot ahead ([`gate::prepare_boot`]): the driver root the
    /// file binds is built and checked, so containerd may start with the boot (unless the config
    /// keeps it for post-start); kubelet waits for post-start. Only in the unit's own start: run
    /// by hand the machine may be running, and its boot keeps its markers. Under `--host-root`
    /// no machine runs from the tree.
    fn boot_gate(&self) -> Result<String> {
        let machine = self.machine;
        if self.ctx.host.is_real_root() && !crate::types::units::runs_in_its_start(machine) {
            return Ok(format!(
                "unit gate: markers left alone (pre-start run outside {}'s start; a running \
                 boot keeps its own)",
                crate::types::units::unit_name(machine)
            ));
        }
        let containerd = self
            .mc
            .containerd_at_boot
            .then_some(&self.mc.containerd_unit);
        let dir = gate::prepare_boot(&self.ctx.host, machine.as_str(), containerd)?;
        Ok(match containerd {
            Some(unit) => format!(
                "unit gate: released {unit} for the boot ahead ({dir}/{unit}): the driver tree \
                 it binds is checked complete"
            ),
            None => format!("unit gate: {dir} emptied; containerd and kubelet wait for post-start"),
        })
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
                format!("{shown}: unchanged")
            },
        )
    }
}

impl BootWork for Boot<'_> {
    fn step(&self, step: BootStep) -> Result<String> {
        match step {
            BootStep::HostNodes => self.make_host_nodes(),
            BootStep::DeviceCgroup => self.device_cgroup(),
            BootStep::GateFile => self.gate_file(),
            BootStep::DriverTree => self.driver_tree(),
            BootStep::BootGate => self.boot_gate(),
            BootStep::NspawnFile => self.nspawn_file(),
        }
    }
}

/// How long pre-start waits for the host's systemd to answer.
const DBUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
