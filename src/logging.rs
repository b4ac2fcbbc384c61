//! Logging: plain lines on stderr, or, when stderr is the journal, the same lines sent natively
//! with the event's fields as journal fields (`MACHINE=`, `UNIT=`, `STEP=`, `US=`), so
//! `journalctl -u systemd-nspawn@kube1 STEP=cdi` finds them.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd as _, BorrowedFd};
use tracing::field::{Field, Value, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// The environment variable that overrides `-v`/`-q`: an `EnvFilter` directive list.
pub const ENV: &str = "NSPAWN_LIFECYCLE_LOG";

/// The filter `-v`/`-q` give, or `NSPAWN_LIFECYCLE_LOG`'s (`value`) when set. A value that is not
/// a list of levels (`trace`…`off`) and `target=level` directives is an error naming it: a typo
/// such as `inf` would otherwise be read as a target name and silence every line.
pub fn filter(verbose: u8, quiet: bool, value: Option<&str>) -> Result<EnvFilter, String> {
    let default = match (quiet, verbose) {
        (true, _) => "warn",
        (false, 0) => "nspawn_lifecycle=info,warn",
        (false, 1) => "nspawn_lifecycle=debug,info",
        (false, _) => "trace",
    };
    let Some(value) = value else {
        return Ok(EnvFilter::new(default));
    };
    let bad = |why: &str| format!("{ENV}={value:?}: {why}");
    let level = |l: &str| l.parse::<tracing_subscriber::filter::LevelFilter>().is_ok();
    for directive in value.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let ok = match directive.split_once('=') {
            Some((target, l)) => !target.is_empty() && level(l),
            None => level(directive),
        };
        if !ok {
            return Err(bad(&format!(
                "{directive:?} is not a level (trace, debug, info, warn, error, off) or target=level"
            )));
        }
    }
    EnvFilter::try_new(value).map_err(|e| bad(&e.to_string()))
}

/// Set up logging to stderr without timestamps (journald adds them); see the module doc. An
/// invalid `NSPAWN_LIFECYCLE_LOG` is an error (the caller exits 2, naming it). Colour only for a
/// person at a terminal, never with `NO_COLOR` set (no-color.org).
pub fn init(verbose: u8, quiet: bool) -> Result<(), String> {
    let value = std::env::var(ENV).ok();
    let filter = filter(verbose, quiet, value.as_deref())?;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let journal = std::env::var("JOURNAL_STREAM")
        .ok()
        .filter(|v| is_journal_stream(v, io::stderr().as_fd()))
        .and_then(|_| journald().ok());
    match journal {
        Some(journald) => tracing_subscriber::registry()
            .with(filter)
            .with(JournalLines {
                text: Box::new(text_layer(false, || Capture)),
                journald,
            })
            .init(),
        None => tracing_subscriber::registry()
            .with(filter)
            .with(text_layer(
                // Hooks log to the journal: colour codes only for a person at a terminal.
                io::IsTerminal::is_terminal(&io::stderr()) && !no_color,
                io::stderr,
            ))
            .init(),
    }
    Ok(())
}

/// Today's line format: level, message, fields; no time (journald adds it), no target.
fn text_layer<S, W>(ansi: bool, writer: W) -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
        .without_time()
        .with_target(false)
}

/// The journal's native socket, fields named as the code names them (`machine` → `MACHINE`, no
/// `F_` prefix), priorities as syslog means them.
fn journald() -> io::Result<tracing_journald::Layer> {
    use tracing_journald::Priority;
    let mut priorities = tracing_journald::PriorityMappings::new();
    priorities.info = Priority::Informational;
    priorities.debug = Priority::Debug;
    Ok(tracing_journald::layer()?
        .with_field_prefix(None)
        .with_priority_mappings(priorities))
}

/// Whether `value` (`$JOURNAL_STREAM`, `<device>:<inode>` in decimal) names the file `fd` is
/// open on: systemd.exec(5) says to compare both, because a child that inherited the variable
/// may have had its stderr redirected elsewhere.
pub(crate) fn is_journal_stream(value: &str, fd: BorrowedFd<'_>) -> bool {
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match nix::sys::stat::fstat(fd) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

thread_local! {
    /// The line the text layer just formatted for the event being sent to the journal.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

struct Capture;

impl io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        LINE.with_borrow_mut(|l| l.extend_from_slice(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sends each event to the journal with `MESSAGE=` set to the very line the text format prints
/// (so `journalctl` reads as it did when stderr was a plain stream, and scripts matching
/// `stopped machine=kube1 unit=…` keep working), and the event's fields beside it.
struct JournalLines<S> {
    text: Box<dyn Layer<S> + Send + Sync>,
    journald: tracing_journald::Layer,
}

impl<S> Layer<S> for JournalLines<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        self.text.on_new_span(attrs, id, ctx.clone());
        self.journald.on_new_span(attrs, id, ctx);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        self.text.on_record(id, values, ctx.clone());
        self.journald.on_record(id, values, ctx);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        LINE.with_borrow_mut(Vec::clear);
        self.text.on_event(event, ctx.clone());
        let line = LINE.with_borrow_mut(std::mem::take);
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches('\n');
        let meta = event.metadata();
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        let Some(first) = meta.fields().iter().next() else {
            return self.journald.on_event(event, ctx);
        };
        let texts: Vec<&str> = fields
            .0
            .iter()
            .map(|(f, v)| match f.name() {
                "message" => line,
                _ => v.as_str(),
            })
            .collect();
        // A callsite has at most 32 fields; the unused slots repeat a field with no value.
        let mut values: [(&Field, Option<&dyn Value>); 32] = [(&first, None); 32];
        for (slot, ((field, _), text)) in values.iter_mut().zip(fields.0.iter().zip(&texts)) {
            *slot = (field, Some(text as &dyn Value));
        }
        let set = meta.fields().value_set(&values);
        let same = match event.parent() {
            Some(parent) => Event::new_child_of(parent.clone(), meta, &set),
            None => Event::new(meta, &set),
        };
        self.journald.on_event(&same, ctx);
    }
}

/// An event's fields with their values as the journal shows them: strings as they are, the rest
/// as their `Debug` form (which is `Display` for `%field`).
struct Fields(Vec<(Field, String)>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.clone(), value.to_owned()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.clone(), format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn journal_stream_must_name_the_fd() {
        let f = tempfile::tempfile().unwrap();
        let m = f.metadata().unwrap();
        let fd = f.as_fd();
        assert!(is_journal_stream(&format!("{}:{}", m.dev(), m.ino()), fd));
        // Inherited from a parent whose stderr was the journal, but ours goes elsewhere.
        assert!(!is_journal_stream(
            &format!("{}:{}", m.dev(), m.ino() + 1),
            fd
        ));
        assert!(!is_journal_stream(
            &format!("{}:{}", m.dev() + 1, m.ino()),
            fd
        ));
        for bad in ["", ":", "12", "a:b", "1:2:3", " 1:2", "-1:2"] {
            assert!(!is_journal_stream(bad, fd), "{bad:?}");
        }
        let other = tempfile::tempfile().unwrap();
        assert!(!is_journal_stream(
            &format!("{}:{}", m.dev(), m.ino()),
            other.as_fd()
        ));
    }
}

#[cfg(test)]
mod filter_tests {
    use super::filter;

    #[test]
    fn a_log_filter_typo_is_an_error_naming_it_and_valid_ones_pass() {
        for bad in ["inf", "nspawn_lifecycle=loud", "=debug", "debug,verbose"] {
            let err = filter(0, false, Some(bad)).unwrap_err();
            assert!(
                err.starts_with(&format!("NSPAWN_LIFECYCLE_LOG={bad:?}: ")),
                "{err}"
            );
        }
        for good in [
            "info",
            "nspawn_lifecycle=debug,warn",
            "off",
            " trace ",
            "zbus=trace,info",
        ] {
            assert!(filter(0, false, Some(good)).is_ok(), "{good}");
        }
        assert_eq!(filter(0, true, None).unwrap().to_string(), "warn");
        assert_eq!(filter(2, false, None).unwrap().to_string(), "trace");
    }
}
