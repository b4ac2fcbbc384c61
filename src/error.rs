//! Error kinds that choose the process exit code; everything else is exit 1.
//!
//! Exit codes (documented in the README):
//! - 0 success
//! - 1 any other failure (the message names the file, unit or device)
//! - 2 bad usage or bad input (machine name, config file, command line)
//! - 3 NVIDIA state incomplete (systemd retries the start until the driver install finishes)
//! - 4 the machine's lock could not be taken (deadline passed, or SIGTERM/SIGINT while waiting)
//!
//! `status` alone answers with a machine state instead (not errors; see `status::State`):
//! - 5 drift: the host changed since the machine's last start (`reconcile` fixes it)
//! - 6 broken: the machine's NVIDIA state or services need a person
//! - 7 not running: the machine's unit is stopped

use std::fmt;

/// Why a run failed, when the caller needs to tell it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bad usage or input: exit 2.
    BadInput,
    /// NVIDIA devices present but the driver is incomplete or mismatched: exit 3.
    DriverIncomplete,
    /// The per-machine lock was not taken: exit 4.
    Lock,
}

impl Kind {
    /// The documented process exit code for this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::BadInput => 2,
            Kind::DriverIncomplete => 3,
            Kind::Lock => 4,
        }
    }
}

/// An error carrying a [`Kind`]; found anywhere in an `anyhow` chain by [`exit_code`].
#[derive(Debug)]
pub(crate) struct Classified {
    pub kind: Kind,
    pub message: String,
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Classified {}

/// Build an error of the given kind.
pub(crate) fn classified(kind: Kind, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Classified {
        kind,
        message: message.into(),
    })
}

/// Shorthand for a bad-input error (exit 2).
pub fn bad_input(message: impl Into<String>) -> anyhow::Error {
    classified(Kind::BadInput, message)
}

/// Every exit code the binary documents (the man page's EXIT STATUS is rendered from this; the
/// README's table says the same, checked by a test).
pub const EXIT_CODES: &[(u8, &str)] = &[
    (0, "Success; for status, the machine is in sync."),
    (
        1,
        "Any other failure; the message names the file, unit or device.",
    ),
    (
        2,
        "Bad usage or input: machine name, configuration file (a disk named for two machines or one the host uses, a mount over the helper's own), command line, NSPAWN_LIFECYCLE_LOG, no machine image, a rootfs shifted off UID 0, a machine not installed or uninstalled, a command that needs root run by another user. Nothing was written. As a unit's pre-start it also stops that unit: no retry mends it.",
    ),
    (
        3,
        "NVIDIA state incomplete: pre-start refuses the start and systemd retries it (also discover --exit-code).",
    ),
    (
        4,
        "The machine's (or host mode's) lock was not taken in time, or SIGTERM or SIGINT came while waiting.",
    ),
    (
        5,
        "status: drift, the host changed since the machine's last start; reconcile fixes it.",
    ),
    (6, "status: broken, something needs a person."),
    (7, "status: the machine is not running."),
    (8, "status --all: no machine is installed."),
    (
        9,
        "plan --exit-code: pre-start would change the machine's .nspawn file.",
    ),
];

/// The kind of an error: the first [`Classified`] in its chain.
pub fn kind(err: &anyhow::Error) -> Option<Kind> {
    err.chain()
        .find_map(|e| e.downcast_ref::<Classified>())
        .map(|c| c.kind)
}

/// The exit code for an error: its [`kind`]'s, else 1.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    kind(err).map_or(1, Kind::exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn exit_code_found_through_context() {
        let err = Err::<(), _>(bad_input("machine name \"../etc\" is invalid"))
            .context("pre-start")
            .unwrap_err();
        assert_eq!(exit_code(&err), 2);
        let err = Err::<(), _>(classified(Kind::DriverIncomplete, "x"))
            .context("outer")
            .unwrap_err();
        assert_eq!(exit_code(&err), 3);
        assert_eq!(exit_code(&anyhow::anyhow!("plain")), 1);
    }
}
