//! Job waiting against a fake systemd on a private `dbus-daemon`: the ordering and deadline
//! cases a real systemd rarely shows on demand. A supplement only: the real proof is the e2e rig
//! (`examples/sd_probe.rs`).
//!
//! Needs `dbus-daemon` (Debian: `apt-get install dbus`; tests/run-all.sh installs it). Without
//! it the test fails: a check that silently does nothing is worse than none.

#![allow(clippy::unwrap_used)]

use nspawn_lifecycle::systemd::{JobResult, Systemd, SystemdError};
use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use zbus::object_server::{ResponseDispatchNotifier, SignalEmitter};
use zbus::runtime::traits::TaskHandle as _;
use zbus::{Connection, OwnedObjectPath};

struct FakeManager {
    next_job: AtomicU32,
}

impl FakeManager {
    fn job(&self) -> (u32, OwnedObjectPath) {
        let id = self.next_job.fetch_add(1, Ordering::SeqCst) + 100;
        let path = format!("/org/freedesktop/systemd1/job/{id}");
        (id, OwnedObjectPath::try_from(path).expect("valid job path"))
    }
}

/// What the fake does is chosen by the unit name:
/// - `before-reply.service`: JobRemoved `done` is sent before the reply to StartUnit (a job that
///   finishes at once), after an unrelated job's JobRemoved;
/// - `after-reply.service`: reply first, then JobRemoved `done` (the usual order);
/// - `<result>.service` for failed/dependency/canceled: JobRemoved with that result;
/// - `hang.service`: no JobRemoved, ever.
#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeManager {
    async fn start_unit(
        &self,
        name: String,
        _mode: String,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> zbus::fdo::Result<ResponseDispatchNotifier<OwnedObjectPath>> {
        let (id, path) = self.job();
        if name == "before-reply.service" {
            let (other_id, other) = self.job();
            Self::job_removed(
                &emitter,
                other_id,
                other,
                "other.service".into(),
                "failed".into(),
            )
            .await?;
            Self::job_removed(&emitter, id, path.clone(), name, "done".into()).await?;
            let (response, _sent) = ResponseDispatchNotifier::new(path);
            return Ok(response);
        }
        let result = match name.as_str() {
            "hang.service" => None,
            "after-reply.service" => Some("done"),
            other => Some(other.trim_end_matches(".service")),
        }
        .map(str::to_owned);
        let (response, sent) = ResponseDispatchNotifier::new(path.clone());
        if let Some(result) = result {
            let emitter = emitter.to_owned();
            conn.spawn("job-removed", async move {
                sent.await;
                let _ = Self::job_removed(&emitter, id, path, name, result).await;
            })
            .detach();
        }
        Ok(response)
    }

    async fn subscribe(&self) {}

    #[zbus(property)]
    async fn system_state(&self) -> String {
        "running".into()
    }

    #[zbus(signal)]
    async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
}

/// A private dbus-daemon, killed on drop.
struct Bus {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn private_bus() -> Option<Bus> {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bus.conf");
    std::fs::write(
        &config,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
            dir.path().display()
        ),
    )
    .unwrap();
    let spawned = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", config.display()))
        .args(["--nofork", "--print-address=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => panic!("starting dbus-daemon (apt-get install dbus): {e}"),
    };
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    Some(Bus {
        child,
        address: line.trim().to_owned(),
        _dir: dir,
    })
}

fn serve_fake_systemd(address: &str) {
    let address = address.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    // The fake runs on its own thread and runtime, like a separate process would.
    std::thread::spawn(move || {
        zbus::block_on(async move {
            let conn = zbus::connection::Builder::address(address.as_str())
                .name("org.freedesktop.systemd1")
                .serve_at(
                    "/org/freedesktop/systemd1",
                    FakeManager {
                        next_job: AtomicU32::new(0),
                    },
                )
                .build()
                .await;
            match conn {
                Ok(_conn) => {
                    tx.send(Ok(())).unwrap();
                    // Keep the connection (and with it the name) until the process ends.
                    std::future::pending::<()>().await
                }
                Err(e) => tx.send(Err(e.to_string())).unwrap(),
            }
        })
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("fake systemd did not start")
        .expect("fake systemd failed to start");
}

fn job_result(err: &anyhow::Error) -> Option<&JobResult> {
    match err.downcast_ref::<SystemdError>() {
        Some(SystemdError::Job { result, .. }) => Some(result),
        _ => None,
    }
}

#[test]
fn job_waits_match_their_own_job_in_any_order_and_honour_deadlines() {
    let Some(bus) = private_bus() else { return };
    serve_fake_systemd(&bus.address);
    let soon = || Instant::now() + Duration::from_secs(10);
    let sd = Systemd::at_address(&bus.address, "fake", soon()).unwrap();
    assert_eq!(sd.system_state(soon()).unwrap(), "running");

    // Signal before reply: only a subscription made before the call sees it.
    sd.start_unit("before-reply.service", soon()).unwrap();
    sd.start_unit("after-reply.service", soon()).unwrap();

    for (unit, want) in [
        ("failed.service", JobResult::Failed),
        ("dependency.service", JobResult::Dependency),
        ("canceled.service", JobResult::Canceled),
    ] {
        let err = sd.start_unit(unit, soon()).unwrap_err();
        assert_eq!(job_result(&err), Some(&want), "{err:#}");
        let msg = format!("{err:#}");
        assert!(msg.contains(unit) && msg.contains("fake"), "{msg}");
    }

    let started = Instant::now();
    let err = sd
        .start_unit("hang.service", started + Duration::from_millis(300))
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(
            err.downcast_ref::<SystemdError>(),
            Some(SystemdError::Timeout { .. })
        ),
        "{err:#}"
    );
    assert!(format!("{err:#}").contains("hang.service"), "{err:#}");
    // Never before the deadline; that it came back at all is the point (the job never ends).
    assert!(waited >= Duration::from_millis(300), "{waited:?}");

    // The connection is still usable after a timed-out wait.
    sd.start_unit("after-reply.service", soon()).unwrap();
}

#[test]
fn a_bus_without_systemd_fails_within_the_deadline() {
    let Some(bus) = private_bus() else { return };
    let started = Instant::now();
    let err =
        Systemd::at_address(&bus.address, "empty", started + Duration::from_secs(5)).unwrap_err();
    // The bus's own refusal, not the deadline's timeout: it failed without waiting.
    let msg = format!("{err:#}");
    assert!(msg.contains("empty: Subscribe failed"), "{msg}");
}
