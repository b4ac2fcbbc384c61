//! Talking to systemd and machined over D-Bus (zbus): on the host's system bus, and on the
//! machine's own system bus reached through the leader's root.
//!
//! Every call has a deadline. Changing a unit's state is a job: the helper subscribes to
//! `JobRemoved` before it asks for the job, then waits for the signal that names the returned job
//! path, so a job that finishes before the reply arrives is never missed. A job that ends other
//! than `done` is a [`SystemdError::Job`] naming the unit.
//!
//! zbus 6 has no blocking API; the public functions here are synchronous and each drives its
//! futures with one `zbus::block_on`, so callers must not call them from inside an async task.

mod deadline;
mod error;
mod machine;
pub(crate) mod proxies;
pub mod services;
mod transient;
mod wait;

pub use error::{JobResult, SystemdError};
pub use wait::{Until, wait_bus, wait_manager, wait_running};

pub use machine::MachineHandle;
pub use transient::{ExitStatus, OUTPUT_LIMIT, TransientOutcome};

use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result, anyhow};
use deadline::{Elapsed, timeout_at};
use futures_core::Stream;
use proxies::{
    JobRemovedStream, MachineManagerProxy, MachineProxy, ManagerProxy, ServiceProxy, UnitProxy,
};
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::time::{Duration, Instant};
use zbus::proxy::CacheProperties;
use zbus::{Connection, OwnedObjectPath, Variant};

/// Backstop for one method call that never answers (the D-Bus reference timeout); every call is
/// also bounded by the caller's deadline, whichever is earlier.
const METHOD_TIMEOUT: Duration = Duration::from_secs(25);
/// How often a job wait with progress reporting samples the unit's state.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// The error systemd answers `GetUnit` with for a unit that is not loaded.
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// How often [`wait_manager`] retries the machine's bus and reads `SystemState`: post-start
/// waits on it at the start of every boot, so a poll is a connection attempt, not a sleep.
const POLL_EVERY: Duration = Duration::from_millis(25);

/// Called while a job runs with the unit's state and the time waited so far.
pub(crate) type Progress<'a> = &'a mut dyn FnMut(&UnitState, Duration);

/// The state of a unit as `systemctl show` would print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitState {
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    /// 32 hex digits, empty when the unit has not run since it was loaded.
    pub invocation_id: String,
}

/// The state of a service's main process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceState {
    /// `success`, `exit-code`, `signal`, `timeout`, `start-limit-hit`, …
    pub result: String,
    pub exec_main_code: i32,
    pub exec_main_status: i32,
    pub n_restarts: u32,
    /// systemd's own start and stop timeouts for the unit (`None` = infinity).
    pub timeout_start: Option<Duration>,
    pub timeout_stop: Option<Duration>,
}

/// The last run of one `ExecStartPost=` command (what `systemctl status` prints as
/// `Process: <pid> ExecStartPost=… (code=exited, status=0/SUCCESS)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExecRun {
    /// argv joined with spaces.
    pub command: String,
    /// Wall-clock start and exit, µs since the epoch; 0 when it has not started or exited.
    pub started_usec: u64,
    pub exited_usec: u64,
    pub pid: u32,
    /// `si_code` of the exit: 1 `CLD_EXITED`, 2 `CLD_KILLED`, 3 `CLD_DUMPED`; 0 while it runs.
    pub code: i32,
    /// Exit status, or the signal number when killed.
    pub status: i32,
}

/// A unit's state with its service result and the last runs of its `ExecStart=` and
/// `ExecStartPost=` commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceRun {
    pub unit: UnitState,
    /// `success`, `exit-code`, `signal`, `timeout`, … (of the last run).
    pub result: String,
    pub exec_start: Vec<ExecRun>,
    pub exec_start_post: Vec<ExecRun>,
}

/// One `Exec*=` command as systemd's property gives it: (path, argv, ignore failure, start
/// realtime µs, start monotonic µs, exit realtime µs, exit monotonic µs, PID, `si_code`, status).
pub(crate) type ExecProperty = (String, Vec<String>, bool, u64, u64, u64, u64, u32, i32, i32);

impl ExecRun {
    fn from_property(p: ExecProperty) -> ExecRun {
        let (_, argv, _, start, _, exit, _, pid, code, status) = p;
        ExecRun {
            command: argv.join(" "),
            started_usec: start,
            exited_usec: exit,
            pid,
            code,
            status,
        }
    }
}

/// A connection to one systemd instance (the host's, or a machine's).
pub struct Systemd {
    conn: Connection,
    label: String,
}

impl fmt::Debug for Systemd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Systemd")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl Systemd {
    /// Connect to the host's system bus (`DBUS_SYSTEM_BUS_ADDRESS` or the default socket).
    pub fn host(deadline: Instant) -> Result<Systemd> {
        zbus::block_on(Systemd::connect(
            zbus::connection::Builder::system(),
            "host".to_owned(),
            deadline,
        ))
        .context("connecting to the host's system bus")
    }

    /// Connect to the bus at a D-Bus address (for tests against a private `dbus-daemon`).
    pub fn at_address(address: &str, label: &str, deadline: Instant) -> Result<Systemd> {
        zbus::block_on(Systemd::connect(
            zbus::connection::Builder::address(address),
            label.to_owned(),
            deadline,
        ))
        .with_context(|| format!("connecting to {address}"))
    }

    /// Connect to `machine`'s system bus through its leader's root. Refuses a machine in a user
    /// namespace of its own with [`SystemdError::ForeignUserNamespace`]; see
    /// [`Systemd::machine_in_any_userns`]. The bus may not exist yet right after a start: see
    /// [`wait_running`].
    pub fn machine(machine: &MachineHandle, deadline: Instant) -> Result<Systemd> {
        machine.check_user_namespace()?;
        Systemd::machine_in_any_userns(machine, deadline)
    }

    /// Like [`Systemd::machine`] but also for a machine in its own user namespace, where reads
    /// work and state changes are refused ("Access denied"). For diagnostics (`status`); what
    /// changes state goes through [`Systemd::machine`].
    pub fn machine_in_any_userns(machine: &MachineHandle, deadline: Instant) -> Result<Systemd> {
        let stream = machine.connect_bus_socket()?;
        // zbus claims our own UID in EXTERNAL; under -U the bus sees host root as the overflow
        // UID and would reject the claim outright, so claim what it sees.
        let uid = machine.uid_seen_inside()?;
        zbus::block_on(Systemd::connect(
            zbus::connection::Builder::unix_stream(stream).user_id(uid),
            format!("machine {}", machine.name()),
            deadline,
        ))
        .with_context(|| format!("connecting to the system bus of machine {}", machine.name()))
    }

    async fn connect(
        builder: zbus::connection::Builder<'_>,
        label: String,
        deadline: Instant,
    ) -> Result<Systemd> {
        let started = Instant::now();
        let conn = match timeout_at(deadline, builder.method_timeout(METHOD_TIMEOUT).build()).await
        {
            Ok(r) => r.map_err(bus_error)?,
            Err(Elapsed) => {
                return Err(SystemdError::Timeout {
                    bus: label,
                    what: "the bus to accept the connection".into(),
                    waited: started.elapsed(),
                }
                .into());
            }
        };
        let sd = Systemd { conn, label };
        // Subscribe so systemd emits JobRemoved for jobs other clients queue too (our own jobs
        // are reported to us regardless); harmless when already subscribed.
        let mgr = sd.manager().await?;
        sd.call("Subscribe", deadline, mgr.subscribe()).await?;
        Ok(sd)
    }

    /// "host" or "machine <name>", the prefix of every error from this connection.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The manager's `SystemState`: `initializing`, `starting`, `running`, `degraded`, …
    pub fn system_state(&self, deadline: Instant) -> Result<String> {
        zbus::block_on(self.system_state_async(deadline))
    }

    /// Start `unit` (mode `replace`) and wait until its job is done.
    pub fn start_unit(&self, unit: &str, deadline: Instant) -> Result<()> {
        zbus::block_on(self.unit_job(JobKind::Start, unit, deadline, None))
    }

    /// Stop `unit` (mode `replace`) and wait until its job is done.
    pub fn stop_unit(&self, unit: &str, deadline: Instant) -> Result<()> {
        zbus::block_on(self.unit_job(JobKind::Stop, unit, deadline, None))
    }

    /// Queue a stop of `unit` (mode `replace`) and return once systemd has taken the job, not
    /// when it is done: the caller may be one of the unit's own processes, which the stop ends.
    pub(crate) fn queue_stop(&self, unit: &str, deadline: Instant) -> Result<()> {
        zbus::block_on(async {
            let mgr = self.manager().await?;
            self.call(
                &format!("StopUnit({unit})"),
                deadline,
                mgr.stop_unit(unit, "replace"),
            )
            .await
            .map(drop)
        })
    }

    /// Restart `unit` (mode `replace`) and wait until its job is done; `progress`, if given, is
    /// called about every 250 ms with the unit's state and the time waited so far.
    pub fn restart_unit(
        &self,
        unit: &str,
        deadline: Instant,
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        zbus::block_on(self.unit_job(JobKind::Restart, unit, deadline, progress))
    }

    /// Clear `unit`'s failed state (and its start rate-limit counter).
    pub fn reset_failed_unit(&self, unit: &str, deadline: Instant) -> Result<()> {
        zbus::block_on(async {
            let mgr = self.manager().await?;
            self.call(
                &format!("ResetFailedUnit({unit})"),
                deadline,
                mgr.reset_failed_unit(unit),
            )
            .await
        })
    }

    /// Load `unit` if needed and read its state.
    pub fn unit_state(&self, unit: &str, deadline: Instant) -> Result<UnitState> {
        zbus::block_on(self.unit_state_async(unit, deadline))
    }

    /// Read a service's result, main-process status, restart count and timeouts.
    pub fn service_state(&self, unit: &str, deadline: Instant) -> Result<ServiceState> {
        zbus::block_on(async {
            let path = self.load_unit(unit, deadline).await?;
            self.service_state_at(unit, &path, deadline).await
        })
    }

    /// Read a service's state, result and the last runs of its `ExecStart=` and `ExecStartPost=`
    /// commands; only property reads (what `status` uses).
    pub(crate) fn service_run(&self, unit: &str, deadline: Instant) -> Result<ServiceRun> {
        zbus::block_on(async {
            let path = self.load_unit(unit, deadline).await?;
            let state = self.unit_state_at(unit, &path, deadline).await?;
            let s = self.service_proxy(&path).await?;
            let what = |p: &str| format!("reading {p} of {unit}");
            let result = self.call(&what("Result"), deadline, s.result()).await?;
            let start = self
                .call(&what("ExecStart"), deadline, s.exec_start())
                .await?;
            let post = self
                .call(&what("ExecStartPost"), deadline, s.exec_start_post())
                .await?;
            Ok(ServiceRun {
                unit: state,
                result,
                exec_start: start.into_iter().map(ExecRun::from_property).collect(),
                exec_start_post: post.into_iter().map(ExecRun::from_property).collect(),
            })
        })
    }

    /// Whether `unit` is loaded from unit files (or drop-ins) that changed on disk since
    /// (`NeedDaemonReload`); a unit that is not loaded is read fresh, so never.
    pub(crate) fn needs_daemon_reload(&self, unit: &str, deadline: Instant) -> Result<bool> {
        zbus::block_on(async {
            let mgr = self.manager().await?;
            let what = format!("GetUnit({unit})");
            let path = match timeout_at(deadline, mgr.get_unit(unit)).await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) if error_name(&e).as_deref() == Some(NO_SUCH_UNIT) => return Ok(false),
                Ok(Err(e)) => return Err(self.describe(e, &what)),
                Err(Elapsed) => anyhow::bail!("{}: no reply to {what} in time", self.label),
            };
            let u = self.unit_proxy(&path).await?;
            self.call(
                &format!("reading NeedDaemonReload of {unit}"),
                deadline,
                u.need_daemon_reload(),
            )
            .await
        })
    }

    /// Reload the manager's unit files (`daemon-reload`); returns once systemd has reloaded.
    pub fn daemon_reload(&self, deadline: Instant) -> Result<()> {
        zbus::block_on(async {
            let mgr = self.manager().await?;
            self.call("Reload", deadline, mgr.reload()).await
        })
    }

    /// `unit`'s `DeviceAllow=` list as systemd holds it now (unit file, drop-ins and runtime
    /// settings together), in order.
    pub(crate) fn device_allow(
        &self,
        unit: &str,
        deadline: Instant,
    ) -> Result<Vec<(String, String)>> {
        zbus::block_on(async {
            let path = self.load_unit(unit, deadline).await?;
            let s = self.service_proxy(&path).await?;
            self.call(
                &format!("reading DeviceAllow of {unit}"),
                deadline,
                s.device_allow(),
            )
            .await
        })
    }

    /// Replace `unit`'s whole `DeviceAllow=` list with `entries` as a runtime setting
    /// (`SetUnitProperties`, runtime: an empty list first, which resets it, then the list, in
    /// one call). systemd writes it to `/run/systemd/system.control/<unit>.d/50-DeviceAllow.conf`
    /// and applies it to the unit's cgroup before it next forks a process for the unit; it is
    /// gone at reboot.
    pub(crate) fn set_device_allow(
        &self,
        unit: &str,
        entries: &[(String, String)],
        deadline: Instant,
    ) -> Result<()> {
        zbus::block_on(async {
            let mgr = self.manager().await?;
            let reset: Vec<(String, String)> = Vec::new();
            let props = [
                ("DeviceAllow", Variant::from(reset)),
                ("DeviceAllow", Variant::from(entries.to_vec())),
            ];
            self.call(
                &format!("SetUnitProperties({unit}, DeviceAllow)"),
                deadline,
                mgr.set_unit_properties(unit, true, &props),
            )
            .await
        })
    }

    /// The leader PID of a machine registered with machined, `None` when it is not registered.
    pub fn machine_leader(&self, machine: &MachineName, deadline: Instant) -> Result<Option<u32>> {
        zbus::block_on(self.machine_leader_async(machine, deadline))
    }

    /// Run `argv` as a transient oneshot service; see [`run_transient`]. With `stdin`, the
    /// command's standard input is that descriptor, passed over the bus
    /// (`StandardInputFileDescriptor`): the command reads the very file the caller opened.
    pub fn run_transient(
        &self,
        name_prefix: &str,
        argv: &[&str],
        stdin: Option<std::os::fd::BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome> {
        transient::run(self, name_prefix, argv, stdin, timeout)
    }

    // ---- internals ---------------------------------------------------------------------------

    async fn manager(&self) -> Result<ManagerProxy<'static>> {
        ManagerProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(bus_error)
    }

    async fn unit_proxy(&self, path: &OwnedObjectPath) -> Result<UnitProxy<'static>> {
        UnitProxy::builder(&self.conn)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(bus_error)
    }

    async fn service_proxy(&self, path: &OwnedObjectPath) -> Result<ServiceProxy<'static>> {
        ServiceProxy::builder(&self.conn)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(bus_error)
    }

    /// One method call bounded by `deadline`, its error named after the bus and the call.
    async fn call<T>(
        &self,
        what: &str,
        deadline: Instant,
        fut: impl Future<Output = zbus::Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        match timeout_at(deadline, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.describe(e, what)),
            Err(Elapsed) => Err(SystemdError::Timeout {
                bus: self.label.clone(),
                what: format!("the reply to {what}"),
                waited: started.elapsed(),
            }
            .into()),
        }
    }

    fn describe(&self, e: zbus::Error, what: &str) -> anyhow::Error {
        let hint = match error_name(&e).as_deref() {
            Some("org.freedesktop.DBus.Error.AccessDenied") => {
                "; the caller is not privileged there (a machine in its own user namespace, the \
                 stock -U, maps host root to nobody)"
            }
            _ => "",
        };
        bus_error(e).context(format!("{}: {what} failed{hint}", self.label))
    }

    async fn system_state_async(&self, deadline: Instant) -> Result<String> {
        let mgr = self.manager().await?;
        self.call("reading SystemState", deadline, mgr.system_state())
            .await
    }

    async fn load_unit(&self, unit: &str, deadline: Instant) -> Result<OwnedObjectPath> {
        let mgr = self.manager().await?;
        self.call(&format!("LoadUnit({unit})"), deadline, mgr.load_unit(unit))
            .await
    }

    async fn unit_state_async(&self, unit: &str, deadline: Instant) -> Result<UnitState> {
        let path = self.load_unit(unit, deadline).await?;
        self.unit_state_at(unit, &path, deadline).await
    }

    async fn unit_state_at(
        &self,
        unit: &str,
        path: &OwnedObjectPath,
        deadline: Instant,
    ) -> Result<UnitState> {
        let u = self.unit_proxy(path).await?;
        let what = |p: &str| format!("reading {p} of {unit}");
        Ok(UnitState {
            load_state: self
                .call(&what("LoadState"), deadline, u.load_state())
                .await?,
            active_state: self
                .call(&what("ActiveState"), deadline, u.active_state())
                .await?,
            sub_state: self
                .call(&what("SubState"), deadline, u.sub_state())
                .await?,
            invocation_id: hex(&self
                .call(&what("InvocationID"), deadline, u.invocation_id())
                .await?),
        })
    }

    async fn service_state_at(
        &self,
        unit: &str,
        path: &OwnedObjectPath,
        deadline: Instant,
    ) -> Result<ServiceState> {
        let s = self.service_proxy(path).await?;
        let what = |p: &str| format!("reading {p} of {unit}");
        let usec = |v: u64| (v != u64::MAX).then(|| Duration::from_micros(v));
        Ok(ServiceState {
            result: self.call(&what("Result"), deadline, s.result()).await?,
            exec_main_code: self
                .call(&what("ExecMainCode"), deadline, s.exec_main_code())
                .await?,
            exec_main_status: self
                .call(&what("ExecMainStatus"), deadline, s.exec_main_status())
                .await?,
            n_restarts: self
                .call(&what("NRestarts"), deadline, s.n_restarts())
                .await?,
            timeout_start: usec(
                self.call(&what("TimeoutStartUSec"), deadline, s.timeout_start_usec())
                    .await?,
            ),
            timeout_stop: usec(
                self.call(&what("TimeoutStopUSec"), deadline, s.timeout_stop_usec())
                    .await?,
            ),
        })
    }

    async fn machine_leader_async(
        &self,
        machine: &MachineName,
        deadline: Instant,
    ) -> Result<Option<u32>> {
        let mm = MachineManagerProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(bus_error)?;
        let gone = |e: &zbus::Error| {
            matches!(
                error_name(e).as_deref(),
                Some(
                    "org.freedesktop.machine1.NoSuchMachine"
                        | "org.freedesktop.DBus.Error.UnknownObject"
                )
            )
        };
        let started = Instant::now();
        let timed_out = |what: String| -> anyhow::Error {
            SystemdError::Timeout {
                bus: self.label.clone(),
                what,
                waited: started.elapsed(),
            }
            .into()
        };
        let what = format!("GetMachine({machine}) on org.freedesktop.machine1");
        let path = match timeout_at(deadline, mm.get_machine(machine.as_str())).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) if gone(&e) => return Ok(None),
            Ok(Err(e)) => return Err(self.describe(e, &what)),
            Err(Elapsed) => return Err(timed_out(format!("the reply to {what}"))),
        };
        let m = MachineProxy::builder(&self.conn)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(bus_error)?;
        match timeout_at(deadline, m.leader()).await {
            Ok(Ok(pid)) => Ok(Some(pid)),
            // It went away between the two calls.
            Ok(Err(e)) if gone(&e) => Ok(None),
            Ok(Err(e)) => Err(self.describe(e, &format!("reading Leader of machine {machine}"))),
            Err(Elapsed) => Err(timed_out(format!("the Leader of machine {machine}"))),
        }
    }

    async fn unit_job(
        &self,
        kind: JobKind,
        unit: &str,
        deadline: Instant,
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        let result = self
            .job(kind.verb(), unit, deadline, progress, |mgr| async move {
                match kind {
                    JobKind::Start => mgr.start_unit(unit, "replace").await,
                    JobKind::Stop => mgr.stop_unit(unit, "replace").await,
                    JobKind::Restart => mgr.restart_unit(unit, "replace").await,
                }
            })
            .await?;
        match result {
            JobResult::Done => Ok(()),
            result => Err(SystemdError::Job {
                bus: self.label.clone(),
                verb: kind.verb(),
                unit: unit.to_owned(),
                result,
            }
            .into()),
        }
    }

    /// Subscribe to `JobRemoved`, queue a job with `enqueue`, and wait for the signal naming
    /// that job. Returns the job's result, whatever it is.
    async fn job<F, Fut>(
        &self,
        verb: &'static str,
        unit: &str,
        deadline: Instant,
        mut progress: Option<Progress<'_>>,
        enqueue: F,
    ) -> Result<JobResult>
    where
        F: FnOnce(ManagerProxy<'static>) -> Fut,
        Fut: Future<Output = zbus::Result<OwnedObjectPath>>,
    {
        let started = Instant::now();
        let mgr = self.manager().await?;
        // Subscribing first means the signal is queued for us even if the job finishes before
        // the reply to the call reaches us.
        let removed = self
            .call(
                "subscribing to JobRemoved",
                deadline,
                mgr.receive_job_removed(),
            )
            .await?;
        let mut removed: Pin<Box<JobRemovedStream>> = Box::pin(removed);
        let what = format!("{verb} of {unit}");
        let job = self.call(&what, deadline, enqueue(mgr.clone())).await?;
        tracing::debug!(bus = %self.label, %unit, job = %job.as_str(), "{verb} job queued");
        let mut next_sample = started;
        loop {
            let wake_at = if progress.is_some() {
                next_sample.min(deadline)
            } else {
                deadline
            };
            match timeout_at(wake_at, next(removed.as_mut())).await {
                Ok(Some(signal)) => {
                    let args = signal
                        .args()
                        .map_err(bus_error)
                        .with_context(|| format!("{}: malformed JobRemoved signal", self.label))?;
                    if args.job == job {
                        tracing::debug!(bus = %self.label, %unit, result = %args.result,
                            "{verb} job finished in {:.2}s", started.elapsed().as_secs_f64());
                        return Ok(JobResult::parse(&args.result));
                    }
                }
                Ok(None) => {
                    return Err(anyhow!(
                        "{}: the bus connection closed while waiting for the {verb} job of {unit} \
                         ({})",
                        self.label,
                        job.as_str()
                    ));
                }
                Err(Elapsed) if Instant::now() >= deadline => {
                    return Err(SystemdError::Timeout {
                        bus: self.label.clone(),
                        what: format!("the {verb} job of {unit} ({}) to finish", job.as_str()),
                        waited: started.elapsed(),
                    }
                    .into());
                }
                Err(Elapsed) => {
                    next_sample = Instant::now() + PROGRESS_EVERY;
                    if let Some(report) = progress.as_mut() {
                        // A sample that cannot be read is skipped; the job wait is what matters.
                        let sample_deadline = deadline.min(Instant::now() + Duration::from_secs(2));
                        if let Ok(st) = self.unit_state_async(unit, sample_deadline).await {
                            report(&st, started.elapsed());
                        }
                    }
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum JobKind {
    Start,
    Stop,
    Restart,
}

impl JobKind {
    fn verb(self) -> &'static str {
        match self {
            JobKind::Start => "start",
            JobKind::Stop => "stop",
            JobKind::Restart => "restart",
        }
    }
}

/// Reload the host manager's unit files (what `install` does after writing a drop-in).
pub fn daemon_reload(host: &Systemd, deadline: Instant) -> Result<()> {
    host.daemon_reload(deadline)
}

/// Run `argv` in the manager behind `conn` as a transient oneshot service named
/// `<name_prefix>-<unique>.service`, wait at most `timeout`, and return its exit status and
/// combined stdout+stderr (the last [`OUTPUT_LIMIT`] bytes). The unit is collected afterwards.
pub fn run_transient(
    conn: &Systemd,
    name_prefix: &str,
    argv: &[&str],
    timeout: Duration,
) -> Result<TransientOutcome> {
    transient::run(conn, name_prefix, argv, None, timeout)
}

/// `e` as an error with no source. zbus prints the error it wraps inside its own message
/// (`failed to connect to `…`: <io error>`, `I/O error: <io error>`, a method error as its own
/// source) and also returns it as `source()`, so `{:#}` would print that cause twice.
fn bus_error(e: zbus::Error) -> anyhow::Error {
    anyhow!(e.to_string())
}

/// The D-Bus error name of a method error reply, if `e` is one.
fn error_name(e: &zbus::Error) -> Option<String> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.to_string()),
        zbus::Error::FDO(f) => Some(zbus::DBusError::name(&**f).to_string()),
        _ => None,
    }
}

async fn next<S: Stream>(mut s: Pin<&mut S>) -> Option<S::Item> {
    poll_fn(|cx| s.as_mut().poll_next(cx)).await
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
