//! Waiting for a machine's systemd: until its bus answers, or until its boot is done.

use super::*;

/// What [`wait_manager`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The machine's manager answers on its bus, whatever its `SystemState` (`initializing` and
    /// `starting` included: the boot goes on while the caller works).
    Bus,
    /// Its `SystemState` is `running` or `degraded` (the boot's jobs are done).
    Running,
}

/// [`wait_manager`] until [`Until::Running`].
pub fn wait_running(machine: &MachineHandle, deadline: Instant) -> Result<Systemd> {
    wait_manager(machine, Until::Running, deadline)
}

/// [`wait_manager`] until [`Until::Bus`]: the earliest moment post-start can talk to the
/// machine's systemd (its dbus runs, so `basic.target` is reached).
///
/// Not PID 1's private socket (`/run/systemd/private`, there a few ms after PID 1 starts), tried
/// on 2026-12-04 (tests/README.md, Performance): PID 1 refuses a peer without a PID in its
/// PID namespace, which a host process is ("Incoming private connection from unprivileged
/// client, refusing: No data available"); connected from a child forked into that namespace,
/// every message PID 1 sends there carries the sender `org.freedesktop.systemd1`, and zbus 6.2.1
/// rejects a message whose sender is not a unique name ("Invalid unique name"; zbus#1497).
pub fn wait_bus(machine: &MachineHandle, deadline: Instant) -> Result<Systemd> {
    wait_manager(machine, Until::Bus, deadline)
}

/// Wait until `machine`'s manager answers on its bus and, for [`Until::Running`], reports
/// `SystemState` `running` or `degraded`, connecting (again) as often as needed: right after a
/// start the machine's bus may not exist yet. Returns the connection. Fails at once for a
/// machine in its own user namespace, when the manager reports `stopping`/`maintenance` (which
/// do not end by waiting), or when the leader exits.
// Over 80 lines because it is one poll loop: connecting, reading the state and deciding whether
// waiting can still help share the `last`/`polls` bookkeeping that makes its one debug line.
pub fn wait_manager(machine: &MachineHandle, until: Until, deadline: Instant) -> Result<Systemd> {
    machine.check_user_namespace()?;
    let started = Instant::now();
    let mut conn: Option<Systemd> = None;
    let mut last = String::from("nothing yet");
    let mut polls = 0u32;
    let note = |last: &mut String, now: String, polls: u32| {
        if *last != now {
            tracing::debug!(machine = %machine.name(), polls, "{now}");
            *last = now;
        }
    };
    loop {
        polls += 1;
        if conn.is_none() {
            // Checked once above: the poll only waits for the bus.
            match Systemd::machine_in_any_userns(machine, deadline) {
                Ok(c) => conn = Some(c),
                Err(e)
                    if matches!(
                        e.downcast_ref::<SystemdError>(),
                        Some(SystemdError::UnsafeBusSocket { .. })
                    ) =>
                {
                    return Err(e);
                }
                Err(e) => note(&mut last, format!("no bus yet ({e:#})"), polls),
            }
        }
        if let Some(c) = &conn {
            match c.system_state(deadline) {
                Ok(state) => {
                    note(&mut last, format!("SystemState '{state}'"), polls);
                    match state.as_str() {
                        "stopping" | "maintenance" => {
                            return Err(anyhow!(
                                "machine {}: its systemd reports SystemState '{state}', which \
                                 will not turn into running by waiting",
                                machine.name()
                            ));
                        }
                        "running" | "degraded" => {
                            tracing::info!(machine = %machine.name(), %state, polls,
                                "machine's systemd is up after {:.2}s", started.elapsed().as_secs_f64());
                            return conn.ok_or_else(|| anyhow!("unreachable: connection vanished"));
                        }
                        _ if until == Until::Bus => {
                            tracing::info!(machine = %machine.name(), %state, polls,
                                "machine's systemd answers on its bus after {:.2}s (still booting)",
                                started.elapsed().as_secs_f64());
                            return conn.ok_or_else(|| anyhow!("unreachable: connection vanished"));
                        }
                        _ => {}
                    }
                }
                Err(e) => {
                    // The bus went away (the machine is still starting or restarting): reconnect.
                    note(
                        &mut last,
                        format!("reading SystemState failed ({e:#})"),
                        polls,
                    );
                    conn = None;
                }
            }
        }
        if !machine.leader_alive() {
            return Err(anyhow!(
                "machine {}: its leader (PID {}) exited while waiting for its systemd; last seen: \
                 {last}",
                machine.name(),
                machine.leader()
            ));
        }
        if Instant::now() + POLL_EVERY >= deadline {
            return Err(anyhow!(SystemdError::Timeout {
                bus: format!("machine {}", machine.name()),
                what: match until {
                    Until::Bus => "its systemd to answer on its bus",
                    Until::Running => "SystemState running or degraded",
                }
                .into(),
                waited: started.elapsed(),
            })
            .context(format!(
                "machine {} {}; last seen: {last}",
                machine.name(),
                match until {
                    Until::Bus => "did not get its systemd on its bus",
                    Until::Running => "did not finish booting",
                }
            )));
        }
        std::thread::sleep(POLL_EVERY);
    }
}
