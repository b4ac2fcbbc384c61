//! Exercise `nspawn_lifecycle::systemd` against a real systemd host and a running machine.
//!
//! Run as root on a host where `systemd-nspawn@<MACHINE>.service` is active (the e2e rig):
//!
//! ```text
//! sd_probe <MACHINE>                  # the whole sequence (machine with PrivateUsers=no)
//! sd_probe <MACHINE> --userns         # the machine runs with the stock -U
//! sd_probe <MACHINE> --connect-only   # wait_running, then read SystemState
//! ```
//!
//! Expects in the machine: `kubelet.service`, `containerd.service`, and for the failure cases
//! `probe-fail.service` (oneshot, exits 1), `probe-dep.service` (Requires= and After= it), and
//! `probe-slow.service` (oneshot, sleeps 30 s). Prints one line per check, `PROBE RESULT` last.

use anyhow::{Context as _, Result, bail};
use nspawn_lifecycle::systemd::{
    ExitStatus, JobResult, MachineHandle, Systemd, SystemdError, wait_running,
};
use nspawn_lifecycle::types::machine_name::MachineName;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let machine: MachineName = match args.next().unwrap_or_else(|| "sdtest".into()).parse() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("sd_probe: {e}");
            std::process::exit(2);
        }
    };
    let mode = args.next().unwrap_or_default();
    let userns = mode == "--userns";
    nspawn_lifecycle::logging::init(1, false).expect("a valid log filter");
    let mut p = Probe::default();
    let r = if userns {
        run_userns(&mut p, &machine)
    } else if mode == "--connect-only" {
        connect_only(&mut p, &machine)
    } else {
        run(&mut p, &machine)
    };
    if let Err(e) = r {
        p.fail("probe aborted", &format!("{e:#}"));
    }
    println!("PROBE RESULT: {} failure(s)", p.fails);
    std::process::exit(i32::from(p.fails > 0));
}

#[derive(Default)]
struct Probe {
    fails: u32,
}

impl Probe {
    fn pass(&mut self, what: &str, detail: &str) {
        println!("PASS {what}: {detail}");
    }
    fn fail(&mut self, what: &str, detail: &str) {
        println!("FAIL {what}: {detail}");
        self.fails += 1;
    }
    fn check(&mut self, ok: bool, what: &str, detail: &str) {
        if ok {
            self.pass(what, detail)
        } else {
            self.fail(what, detail)
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn by(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

fn run(p: &mut Probe, machine: &MachineName) -> Result<()> {
    let t = Instant::now();
    let host = Systemd::host(by(5))?;
    p.pass("host bus", &format!("connected in {}", secs(t.elapsed())));
    let unit = format!("systemd-nspawn@{machine}.service");

    let t = Instant::now();
    let handle = MachineHandle::find(&host, machine, by(5))?;
    p.pass(
        "GetMachine -> Leader",
        &format!(
            "leader {} own-userns={} in {}",
            handle.leader(),
            handle.has_own_user_namespace(),
            secs(t.elapsed())
        ),
    );

    let t = Instant::now();
    let sd = wait_running(&handle, by(30))?;
    let state = sd.system_state(by(5))?;
    p.check(
        state == "running" || state == "degraded",
        "wait_running",
        &format!("SystemState {state} after {}", secs(t.elapsed())),
    );

    // Stop kubelet then containerd, start containerd then kubelet: the post-start sequence.
    for (verb, u) in [
        ("stop", "kubelet.service"),
        ("stop", "containerd.service"),
        ("start", "containerd.service"),
        ("start", "kubelet.service"),
    ] {
        let t = Instant::now();
        let r = if verb == "stop" {
            sd.stop_unit(u, by(30))
        } else {
            sd.start_unit(u, by(30))
        };
        let st = sd.unit_state(u, by(5))?;
        let want = if verb == "stop" { "inactive" } else { "active" };
        p.check(
            r.is_ok() && st.active_state == want,
            &format!("{verb} {u}"),
            &format!(
                "{r:?} -> {}/{} in {}",
                st.active_state,
                st.sub_state,
                secs(t.elapsed())
            ),
        );
    }

    // A failing job is a typed error naming the unit and the result.
    let r = sd.start_unit("probe-fail.service", by(30));
    job_error(p, "start of a failing unit", r, &JobResult::Failed);
    let r = sd.start_unit("probe-dep.service", by(30));
    job_error(
        p,
        "start of a unit whose dependency fails",
        r,
        &JobResult::Dependency,
    );
    let st = sd.service_state("probe-fail.service", by(5))?;
    p.check(
        st.result == "exit-code" && st.exec_main_status == 1,
        "Service Result/ExecMainStatus of the failed unit",
        &format!("{st:?}"),
    );
    sd.reset_failed_unit("probe-fail.service", by(5))?;
    let st = sd.unit_state("probe-fail.service", by(5))?;
    p.check(
        st.active_state == "inactive",
        "ResetFailedUnit",
        &format!("now {}/{}", st.active_state, st.sub_state),
    );

    // A job that outlives its deadline.
    let t = Instant::now();
    let r = sd.start_unit(
        "probe-slow.service",
        Instant::now() + Duration::from_millis(1500),
    );
    let timed_out = matches!(
        r.as_ref()
            .err()
            .and_then(|e| e.downcast_ref::<SystemdError>()),
        Some(SystemdError::Timeout { .. })
    );
    p.check(
        timed_out,
        "deadline on a job wait",
        &format!("{} after {}", show(&r), secs(t.elapsed())),
    );
    sd.stop_unit("probe-slow.service", by(30))?;

    // Transient units: status and output.
    let t = Instant::now();
    let o = sd.run_transient(
        "nspawn-lifecycle-probe",
        &["/bin/sh", "-c", "echo hi; echo oops >&2; exit 3"],
        None,
        Duration::from_secs(30),
    )?;
    p.check(
        o.exit_status == ExitStatus::Exited(3) && o.output == "hi\noops\n",
        "transient sh -c 'echo hi; echo oops >&2; exit 3'",
        &format!(
            "{} (Result {}), output {:?}, unit {}, {}",
            o.exit_status,
            o.result,
            o.output,
            o.unit,
            secs(t.elapsed())
        ),
    );
    gone(p, &sd, &o.unit)?;
    let t = Instant::now();
    let o = sd.run_transient(
        "nspawn-lifecycle-ldconfig",
        &["/sbin/ldconfig"],
        None,
        by_dur(60),
    )?;
    p.check(
        o.success(),
        "transient /sbin/ldconfig",
        &format!(
            "{} output {:?} in {}",
            o.exit_status,
            o.output,
            secs(t.elapsed())
        ),
    );
    gone(p, &sd, &o.unit)?;
    let o = sd.run_transient(
        "nspawn-lifecycle-probe",
        &[
            "/bin/sh",
            "-c",
            "head -c 200000 /dev/zero | tr '\\0' x; echo; echo tail-line",
        ],
        None,
        by_dur(30),
    )?;
    p.check(
        o.success() && o.output_dropped > 0 && o.output.ends_with("tail-line\n"),
        "transient with 200 kB of output keeps the tail",
        &format!(
            "{}: kept {} bytes, dropped {}",
            o.exit_status,
            o.output.len(),
            o.output_dropped
        ),
    );
    let t = Instant::now();
    let o = sd.run_transient(
        "nspawn-lifecycle-probe",
        &["/bin/sh", "-c", "echo started; exec sleep 30"],
        None,
        Duration::from_secs(1),
    )?;
    p.check(
        !o.success() && o.result == "timeout" && o.output == "started\n",
        "transient past its timeout is killed by systemd",
        &format!(
            "{} (Result {}) output {:?} after {}",
            o.exit_status,
            o.result,
            o.output,
            secs(t.elapsed())
        ),
    );
    gone(p, &sd, &o.unit)?;
    let o = sd.run_transient(
        "nspawn-lifecycle-probe",
        &["/nonexistent/ctr"],
        None,
        by_dur(30),
    )?;
    p.check(
        !o.success(),
        "transient with a missing binary",
        &format!(
            "{} (Result {}) {:?}",
            o.exit_status,
            o.result,
            o.check("ctr import")
        ),
    );
    gone(p, &sd, &o.unit)?;

    // daemon-reload, on the machine's manager and the host's.
    let t = Instant::now();
    sd.daemon_reload(by(30))?;
    nspawn_lifecycle::systemd::daemon_reload(&host, by(30))?;
    p.pass("Reload (machine, host)", &secs(t.elapsed()));
    drop(sd);

    // Reconcile's core: RestartUnit of the machine's unit on the host bus.
    let before = host.unit_state(&unit, by(5))?;
    let old_leader = handle.leader();
    let t = Instant::now();
    let mut seen = Vec::new();
    let mut progress = |st: &nspawn_lifecycle::systemd::UnitState, _: Duration| {
        let s = format!("{}/{}", st.active_state, st.sub_state);
        if seen.last() != Some(&s) {
            seen.push(s);
        }
    };
    host.restart_unit(&unit, by(120), Some(&mut progress))?;
    let took = t.elapsed();
    let after = host.unit_state(&unit, by(5))?;
    let new_leader = host.machine_leader(machine, by(5))?;
    p.check(
        after.active_state == "active"
            && after.invocation_id != before.invocation_id
            && new_leader.is_some_and(|l| l != old_leader),
        "RestartUnit of the machine's unit",
        &format!(
            "{took:?}: invocation {} -> {}, leader {old_leader} -> {new_leader:?}, states seen {seen:?}",
            &before.invocation_id[..8.min(before.invocation_id.len())],
            &after.invocation_id[..8.min(after.invocation_id.len())],
        ),
    );
    let handle = MachineHandle::find(&host, machine, by(5))?;
    let sd = wait_running(&handle, by(30))?;
    let st = sd.unit_state("kubelet.service", by(5))?;
    p.check(
        st.active_state == "active",
        "kubelet active in the restarted machine",
        &format!("{}/{}", st.active_state, st.sub_state),
    );
    Ok(())
}

fn by_dur(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn show<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("Err({e:#})"),
    }
}

fn job_error(p: &mut Probe, what: &str, r: Result<()>, want: &JobResult) {
    let got = r
        .as_ref()
        .err()
        .and_then(|e| e.downcast_ref::<SystemdError>());
    let ok = matches!(got, Some(SystemdError::Job { result, .. }) if result == want);
    p.check(ok, what, &show(&r));
}

/// The transient unit was collected (no unit object left behind).
fn gone(p: &mut Probe, sd: &Systemd, unit: &str) -> Result<()> {
    // Collection happens on the manager's next loop iteration after Unref.
    std::thread::sleep(Duration::from_millis(200));
    let st = sd.unit_state(unit, by(5))?;
    p.check(
        st.load_state == "not-found" && st.active_state == "inactive",
        &format!("{unit} collected"),
        &format!(
            "LoadState {} ActiveState {}",
            st.load_state, st.active_state
        ),
    );
    Ok(())
}

/// Stock -U: the refusal, and what the raw socket does.
fn run_userns(p: &mut Probe, machine: &MachineName) -> Result<()> {
    let host = Systemd::host(by(5))?;
    let handle = MachineHandle::find(&host, machine, by(5))?;
    p.check(
        handle.has_own_user_namespace(),
        "machine has its own user namespace",
        &format!("leader {}", handle.leader()),
    );
    match wait_running(&handle, by(10)) {
        Ok(_) => p.fail("wait_running refuses -U", "it connected"),
        Err(e) => {
            let typed = matches!(
                e.downcast_ref::<SystemdError>(),
                Some(SystemdError::ForeignUserNamespace { .. })
            );
            p.check(typed, "wait_running refuses -U", &format!("{e:#}"));
        }
    }
    let sd = Systemd::machine_in_any_userns(&handle, by(10)).context("raw connection")?;
    let state = sd.system_state(by(5))?;
    p.pass(
        "raw socket under -U can read",
        &format!("SystemState {state}"),
    );
    match sd.stop_unit("kubelet.service", by(10)) {
        Ok(()) => bail!("StopUnit was allowed under -U"),
        Err(e) => {
            let msg = format!("{e:#}");
            p.check(
                msg.contains("AccessDenied") || msg.contains("Access denied"),
                "raw socket under -U cannot StopUnit",
                &msg,
            );
        }
    }
    Ok(())
}

/// Only connect and read SystemState (for the planted-symlink check).
fn connect_only(p: &mut Probe, machine: &MachineName) -> Result<()> {
    let host = Systemd::host(by(5))?;
    let handle = MachineHandle::find(&host, machine, by(5))?;
    match wait_running(&handle, by(30)).and_then(|sd| sd.system_state(by(5))) {
        Ok(state) => p.pass(
            "connect to the machine bus",
            &format!("SystemState {state}"),
        ),
        Err(e) => p.fail("connect to the machine bus", &format!("{e:#}")),
    }
    Ok(())
}
