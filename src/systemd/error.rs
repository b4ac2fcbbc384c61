//! How a systemd job ended, and the failures a caller may want to tell apart.

use super::*;

/// How a systemd job ended (the `result` of `JobRemoved`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobResult {
    Done,
    Canceled,
    Timeout,
    Failed,
    Dependency,
    Skipped,
    Other(String),
}

impl JobResult {
    pub fn parse(s: &str) -> JobResult {
        match s {
            "done" => JobResult::Done,
            "canceled" => JobResult::Canceled,
            "timeout" => JobResult::Timeout,
            "failed" => JobResult::Failed,
            "dependency" => JobResult::Dependency,
            "skipped" => JobResult::Skipped,
            other => JobResult::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            JobResult::Done => "done",
            JobResult::Canceled => "canceled",
            JobResult::Timeout => "timeout",
            JobResult::Failed => "failed",
            JobResult::Dependency => "dependency",
            JobResult::Skipped => "skipped",
            JobResult::Other(s) => s,
        }
    }

    /// What the result means, in an operator's words.
    fn meaning(&self) -> &'static str {
        match self {
            JobResult::Done => "it finished",
            JobResult::Canceled => "another job replaced it or the unit was stopped meanwhile",
            JobResult::Timeout => "the unit's own systemd timeout expired",
            JobResult::Failed => "the unit failed",
            JobResult::Dependency => "a unit it depends on failed",
            JobResult::Skipped => "the unit was not active, so there was nothing to do",
            JobResult::Other(_) => "systemd reported an unknown result",
        }
    }
}

impl fmt::Display for JobResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Failures a caller may want to tell apart; everything else is a plain `anyhow` error.
#[derive(Debug)]
pub enum SystemdError {
    /// A job ended with a result other than `done`.
    Job {
        bus: String,
        verb: &'static str,
        unit: String,
        result: JobResult,
    },
    /// A deadline passed while waiting for `what`.
    Timeout {
        bus: String,
        what: String,
        waited: Duration,
    },
    /// The machine runs in a user namespace of its own (stock `-U`): host root is not root in it,
    /// so its systemd refuses to start or stop units for us.
    ForeignUserNamespace { machine: String, leader: u32 },
    /// The machine's bus socket path resolves to something that is not a socket, or through a
    /// magic link: a broken or hostile machine, not one still booting.
    UnsafeBusSocket { machine: String, detail: String },
}

impl fmt::Display for SystemdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SystemdError::Job {
                bus,
                verb,
                unit,
                result,
            } => write!(
                f,
                "{bus}: {verb} job for {unit} ended with result '{result}' ({})",
                result.meaning()
            ),
            SystemdError::Timeout { bus, what, waited } => write!(
                f,
                "{bus}: gave up waiting for {what} after {:.1}s (deadline passed)",
                waited.as_secs_f64()
            ),
            SystemdError::ForeignUserNamespace { machine, leader } => write!(
                f,
                "machine {machine} (leader PID {leader}) runs in a user namespace of its own \
                 (PrivateUsers= is not \"no\", e.g. the stock -U of systemd-nspawn@.service): host \
                 root is unmapped inside it, so the machine's systemd would answer \"Access \
                 denied\" to StopUnit/StartUnit; set PrivateUsers=no in \
                 /etc/systemd/nspawn/{machine}.nspawn (pre-start renders it) and restart the machine"
            ),
            SystemdError::UnsafeBusSocket { machine, detail } => write!(
                f,
                "machine {machine}: refusing to connect to /run/dbus/system_bus_socket inside the \
                 machine: {detail}"
            ),
        }
    }
}

impl std::error::Error for SystemdError {}
