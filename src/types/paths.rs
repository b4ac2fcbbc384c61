//! Host paths, machine paths and unit names, validated before any renderer sees them.
//!
//! Every value that reaches a rendered file (the `.nspawn` file, the drop-in) is one of these
//! types, so a renderer cannot be handed a newline or a stray `:`. What systemd's syntax can
//! escape is escaped by [`bind_escape`]; what it cannot carry is refused here, with a message that
//! names the value (escaped with `escape_debug`).
//!
//! What systemd 252 does with a `Bind=`/`BindReadOnly=` line of a `.nspawn` file (and so what
//! these types allow):
//! - the config-file parser strips ASCII whitespace around the value, joins a line that ends in an
//!   odd number of backslashes with the next one, and reads `#`/`;` as a comment only at the start
//!   of a line;
//! - `bind_mount_parse` splits the value at unescaped `:` (`extract_many_words(":",
//!   EXTRACT_DONT_COALESCE_SEPARATORS)`): without unescape flags a backslash takes the next
//!   character literally, so `\:` carries a colon and `\\` a backslash; quotes are literal;
//! - both paths only need to be absolute.
//!
//! So a path may hold spaces, colons, backslashes, quotes and non-ASCII; it may not hold control
//! characters (a newline ends the line) or end in a space (stripped). Paths are also kept
//! normalized (no `.`, `..`, `//`, trailing `/`) so a target can never leave the machine.

use serde::Serialize;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

/// Longest path accepted, in bytes (the kernel's `PATH_MAX` without the NUL).
pub(crate) const MAX_PATH: usize = libc::PATH_MAX as usize - 1;

/// Why `p` cannot be a path in a rendered file, or `None` when it can.
fn path_problem(p: &str) -> Option<String> {
    let shown = p.escape_debug();
    if !p.starts_with('/') {
        return Some(format!("\"{shown}\" is not an absolute path"));
    }
    if p.len() > MAX_PATH {
        return Some(format!(
            "\"{}…\" is {} bytes long; at most {MAX_PATH} are allowed",
            p.chars().take(64).collect::<String>().escape_debug(),
            p.len()
        ));
    }
    if let Some(c) = p.chars().find(|c| c.is_control()) {
        return Some(format!(
            "\"{shown}\" contains the control character {c:?}, which a .nspawn or unit file \
             cannot carry"
        ));
    }
    if p.split('/').any(|c| c == "." || c == "..")
        || p.contains("//")
        || (p.len() > 1 && p.ends_with('/'))
    {
        return Some(format!(
            "\"{shown}\" is not a normalized path (no '.', '..', '//' or trailing '/')"
        ));
    }
    if p.ends_with(' ') {
        return Some(format!(
            "\"{shown}\" ends in a space, which systemd strips from a setting's value"
        ));
    }
    None
}

macro_rules! path_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match path_problem(s) {
                    Some(problem) => Err(problem),
                    None => Ok($name(s.to_owned())),
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                match path_problem(&s) {
                    Some(problem) => Err(problem),
                    None => Ok($name(s)),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<std::path::Path> for $name {
            fn as_ref(&self) -> &std::path::Path {
                std::path::Path::new(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }
    };
}

path_type!(
    /// An absolute, normalized path on the host that a `.nspawn` or unit file can carry.
    HostPath
);
path_type!(
    /// An absolute, normalized path inside the machine that a `.nspawn` file can carry.
    MachinePath
);

impl MachinePath {
    /// The machine path equal to a host path (a bind at the same path); both types check the
    /// same rules.
    pub(crate) fn same_as(host: &HostPath) -> MachinePath {
        MachinePath(host.0.clone())
    }
}

/// Unit types systemd knows (`unit_type_from_string`); a unit name must end in one of them.
const UNIT_TYPES: &[&str] = &[
    "service",
    "socket",
    "target",
    "device",
    "mount",
    "automount",
    "swap",
    "timer",
    "path",
    "slice",
    "scope",
];

/// Longest unit name systemd accepts (`UNIT_NAME_MAX` without the NUL).
const MAX_UNIT_NAME: usize = 255;

/// A unit name as systemd's `unit_name_is_valid(UNIT_NAME_PLAIN|UNIT_NAME_INSTANCE)` accepts it:
/// `[A-Za-z0-9:_.\-\\]` with at most an `@instance` part, and a known unit type as suffix. A
/// template without instance (`foo@.service`) cannot be started and is refused. Escapes such as
/// `\x2d` are part of the name: the drop-in directory is `kube\x2dlet.service.d` literally.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct UnitName(String);

impl UnitName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for UnitName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shown = s.escape_debug();
        let bad = |why: &str| Err(format!("\"{shown}\" is not a unit name: {why}"));
        if s.is_empty() {
            return bad("it is empty");
        }
        if s.len() > MAX_UNIT_NAME {
            return bad(&format!(
                "it is {} bytes long; at most {MAX_UNIT_NAME} are allowed",
                s.len()
            ));
        }
        let Some((stem, suffix)) = s.rsplit_once('.') else {
            return bad("it has no type suffix such as \".service\"");
        };
        if !UNIT_TYPES.contains(&suffix) {
            return bad(&format!(
                "\".{}\" is not a unit type ({})",
                suffix.escape_debug(),
                UNIT_TYPES.join(", ")
            ));
        }
        let plain =
            |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.' | '\\');
        let (prefix, instance) = match stem.split_once('@') {
            Some((p, i)) => (p, Some(i)),
            None => (stem, None),
        };
        if prefix.is_empty() {
            return bad("the part before the type suffix or '@' is empty");
        }
        if let Some(c) = prefix.chars().find(|&c| !plain(c)) {
            return bad(&format!(
                "it contains {c:?}; only A-Z a-z 0-9 : - _ . \\ and one '@' are allowed"
            ));
        }
        if let Some(i) = instance {
            if i.is_empty() {
                return bad("it is a template without an instance, which cannot be started");
            }
            if let Some(c) = i.chars().find(|&c| !(plain(c) || c == '@')) {
                return bad(&format!(
                    "its instance contains {c:?}; only A-Z a-z 0-9 : - _ . \\ @ are allowed"
                ));
            }
        }
        Ok(UnitName(s.to_owned()))
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Deref for UnitName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for UnitName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for UnitName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for UnitName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// One path of a `Bind=` value, escaped for `bind_mount_parse`: `\` → `\\`, `:` → `\:`.
/// Everything else a [`HostPath`]/[`MachinePath`] may hold is literal there.
pub(crate) fn bind_escape(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        if matches!(c, '\\' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A model of how systemd 252 reads one `Bind=`/`BindReadOnly=` line of a `.nspawn` file:
/// `Some((source, target))` as nspawn would bind them, `None` when systemd would join the line
/// with the next one, reject the value, or take part of it as mount options. For tests and the
/// config fuzz target: every rendered bind line must read back to its own paths.
pub fn parse_bind_line(line: &str) -> Option<(String, String)> {
    const WS: &[char] = &[' ', '\t', '\n', '\r'];
    if line.contains(['\n', '\r', '\0']) {
        return None;
    }
    let line = line.trim_matches(WS);
    // conf-parser.c: a line ending in an unescaped backslash continues on the next one.
    let mut escaped = false;
    for c in line.chars() {
        escaped = !escaped && c == '\\';
    }
    if escaped {
        return None;
    }
    let (key, value) = line.split_once('=')?;
    if !matches!(key.trim_matches(WS), "Bind" | "BindReadOnly") {
        return None;
    }
    let value = value.trim_matches(WS);
    // extract_many_words(":", EXTRACT_DONT_COALESCE_SEPARATORS): up to two words, the rest
    // (after a second unescaped ':') is mount options.
    let mut words = vec![String::new()];
    let mut chars = value.chars();
    let mut rest = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => words.last_mut()?.push(chars.next()?),
            ':' if words.len() == 2 => {
                rest = true;
                break;
            }
            ':' => words.push(String::new()),
            c => words.last_mut()?.push(c),
        }
    }
    if rest && chars.next().is_some() {
        return None;
    }
    let source = words[0].clone();
    let target = words.get(1).cloned().unwrap_or_else(|| source.clone());
    if !source.starts_with('/') || !target.starts_with('/') {
        return None;
    }
    Some((source, target))
}

/// Lexically resolve a symlink `target` found in directory `dir` (both absolute paths: a machine's, or the host's).
pub(crate) fn normalize(dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        dir.split('/').filter(|c| !c.is_empty()).collect()
    };
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_but_carriable_paths_are_accepted() {
        for ok in [
            "/",
            "/data/models",
            "/data/with space",
            "/data/a:b",
            "/data/back\\slash",
            "/data/ümlaut/日本",
            "/data/\"quoted\" 'too'",
            "/data/#not-a-comment;",
            "/data/trailing\u{a0}",
        ] {
            assert_eq!(ok.parse::<HostPath>().unwrap().as_str(), ok);
            assert_eq!(ok.parse::<MachinePath>().unwrap().as_str(), ok);
        }
    }

    #[test]
    fn what_a_line_cannot_carry_is_refused_by_name() {
        for (bad, needle) in [
            ("relative", "not an absolute path"),
            ("", "not an absolute path"),
            ("/a\nPrivateUsers=pick", "control character '\\n'"),
            ("/a\tb", "control character '\\t'"),
            ("/a\0b", "control character '\\0'"),
            ("/a\u{7f}", "control character '\\u{7f}'"),
            ("/a\u{85}", "control character '\\u{85}'"),
            ("/a\rb", "control character '\\r'"),
            ("/a/../etc", "not a normalized path"),
            ("/a/./b", "not a normalized path"),
            ("/a//b", "not a normalized path"),
            ("/a/", "not a normalized path"),
            ("/a ", "ends in a space"),
        ] {
            let err = bad.parse::<HostPath>().unwrap_err();
            assert!(err.contains(needle), "{bad:?}: {err}");
            assert!(
                err.contains(&bad.escape_debug().to_string()),
                "{err} must name {bad:?}"
            );
            assert!(
                !err.contains('\n'),
                "the message itself stays one line: {err:?}"
            );
        }
        let long = format!("/{}", "x".repeat(MAX_PATH));
        assert!(
            long.parse::<MachinePath>()
                .unwrap_err()
                .contains("bytes long")
        );
    }

    #[test]
    fn unit_names_follow_systemd() {
        for ok in [
            "kubelet.service",
            "kube\\x2dlet.service",
            "kube:let.service",
            "getty@tty1.service",
            "a@b@c.service",
            "k8s.target",
            ".hidden.service",
        ] {
            assert_eq!(ok.parse::<UnitName>().unwrap().as_str(), ok);
        }
        for bad in [
            "",
            "kubelet",
            "kubelet.servic",
            ".service",
            "@x.service",
            "getty@.service",
            "kube let.service",
            "kube/let.service",
            "kube\nlet.service",
            "kübelet.service",
            "x.service\n",
        ] {
            let err = bad.parse::<UnitName>().unwrap_err();
            assert!(
                err.contains(&format!("\"{}\"", bad.escape_debug())),
                "{err} must name {bad:?}"
            );
        }
        assert!(
            format!("{}.service", "x".repeat(248))
                .parse::<UnitName>()
                .unwrap_err()
                .contains("256 bytes")
        );
    }

    /// Every path of up to four characters over an alphabet of what a line treats specially:
    /// accepted ones read back as themselves, as source and as target.
    #[test]
    fn every_short_accepted_path_reads_back() {
        let alphabet = ['a', '/', ':', '\\', ' ', '.', '#', '=', 'ü', '\t', '"'];
        let mut paths = vec![String::from("/")];
        let mut frontier = paths.clone();
        for _ in 0..4 {
            let mut next = Vec::new();
            for p in &frontier {
                for c in alphabet {
                    next.push(format!("{p}{c}"));
                }
            }
            paths.extend(next.iter().cloned());
            frontier = next;
        }
        let mut accepted = 0;
        for p in &paths {
            let Ok(h) = p.parse::<HostPath>() else {
                continue;
            };
            accepted += 1;
            for other in ["/x", "/a:b\\"] {
                let line = format!("Bind={}:{}", bind_escape(&h), bind_escape(other));
                assert_eq!(
                    parse_bind_line(&line),
                    Some((p.clone(), other.to_owned())),
                    "{line:?}"
                );
                let line = format!("BindReadOnly={}:{}", bind_escape(other), bind_escape(&h));
                assert_eq!(
                    parse_bind_line(&line),
                    Some((other.to_owned(), p.clone())),
                    "{line:?}"
                );
            }
            let line = format!("Bind={}", bind_escape(&h));
            assert_eq!(
                parse_bind_line(&line),
                Some((p.clone(), p.clone())),
                "{line:?}"
            );
        }
        assert!(accepted > 1000, "{accepted} of {} accepted", paths.len());
    }

    #[test]
    fn escaped_paths_read_back_as_themselves() {
        let cases = [
            ("/a", "/a"),
            ("/data/with space", "/mnt/with space"),
            ("/data/a:b", "/mnt/c:d:e"),
            ("/data/back\\slash\\", "/x\\"),
            ("/data/ümlaut", "/日本"),
            (
                "/run/nspawn-lifecycle/unit-gate.conf",
                "/run/systemd/system/kube:let.service.d/x",
            ),
            ("/q\"'#;=", "/=="),
        ];
        for (s, t) in cases {
            for line in [
                format!("Bind={}:{}", bind_escape(s), bind_escape(t)),
                format!("BindReadOnly={}:{}", bind_escape(s), bind_escape(t)),
            ] {
                assert_eq!(
                    parse_bind_line(&line),
                    Some((s.to_owned(), t.to_owned())),
                    "{line}"
                );
            }
        }
        // Unescaped, a colon splits the value: the bug this escaping prevents.
        assert_eq!(
            parse_bind_line("BindReadOnly=/g:/run/systemd/system/kube:let.service.d/x"),
            None
        );
        assert_eq!(
            parse_bind_line("Bind=/a:b"),
            None,
            "\"b\" is not an absolute target"
        );
        assert_eq!(
            parse_bind_line("Bind=/a:/b:ro"),
            None,
            "options are not something we render"
        );
        assert_eq!(parse_bind_line("Bind=/a\\"), None, "continuation");
        assert_eq!(
            parse_bind_line("Bind=/a\\\\"),
            Some(("/a\\".into(), "/a\\".into()))
        );
    }
}
