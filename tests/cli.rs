//! The binary's command line as an operator meets it: shell completions and man pages generated
//! from the clap definition, and error lines that name each cause once.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_nspawn-lifecycle-helper");
const NAME: &str = "nspawn-lifecycle-helper";

/// Run the helper with a --host-root that does not exist: completions and man pages need no host.
fn helper(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--host-root", "/nonexistent/host"])
        .args(args)
        .output()
        .expect("running the helper")
}

fn stdout_of(args: &[&str]) -> String {
    let out = helper(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// What bash offers for the words typed so far (the last one is being completed), asked the way
/// bash asks: through the function `complete -p` names, with COMP_WORDS and COMP_CWORD set.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        r#"set -u
source '{script}'
spec=$(complete -p {NAME}) || exit 10
fn=$(printf '%s\n' "$spec" | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
[ -n "$fn" ] || {{ echo "no -F function in: $spec" >&2; exit 11; }}
COMP_WORDS=({words})
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
prev=""
[ "$COMP_CWORD" -gt 0 ] && prev=${{COMP_WORDS[COMP_CWORD-1]}}
"$fn" {NAME} "${{COMP_WORDS[COMP_CWORD]}}" "$prev"
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        script = script.display(),
        words = quoted.join(" "),
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "bash for {words:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completion_loads_and_completes_the_hooks() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nspawn-lifecycle-helper.bash");
    std::fs::write(&script, stdout_of(&["completions", "bash"])).unwrap();
    assert_eq!(
        bash_complete(&script, &[NAME, "nspawn-lifecycle", "pre"]),
        ["pre-start"]
    );
    assert_eq!(
        bash_complete(&script, &[NAME, "nspawn-lifecycle", "rec"]),
        ["reconcile"]
    );
    assert_eq!(
        bash_complete(&script, &[NAME, "nspawn-l"]),
        ["nspawn-lifecycle"]
    );
    assert_eq!(bash_complete(&script, &[NAME, "comp"]), ["completions"]);
    assert_eq!(
        bash_complete(&script, &[NAME, "install", "--dry"]),
        ["--dry-run"]
    );
    assert_eq!(
        bash_complete(&script, &[NAME, "completions", "f"]),
        ["fish"]
    );
}

/// Completions offer no hidden command (the hooks' plumbing, packaging), and where a command
/// takes MACHINE, the installed machines (drop-ins under `--host-root` when the line gives one);
/// `install`, the machine images.
#[test]
fn completions_hide_plumbing_and_offer_installed_machines() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nspawn-lifecycle-helper.bash");
    std::fs::write(&script, stdout_of(&["completions", "bash"])).unwrap();
    let top = bash_complete(&script, &[NAME, ""]);
    for hidden in ["cdi-hook", "manpages", "failpoints", "rewire-root"] {
        assert!(
            !top.iter().any(|w| w == hidden),
            "{hidden} offered: {top:?}"
        );
    }
    assert!(top.iter().any(|w| w == "status"), "{top:?}");
    let host = tempfile::tempdir().unwrap();
    for m in ["kube1", "gpu2"] {
        let d = host
            .path()
            .join(format!("etc/systemd/system/systemd-nspawn@{m}.service.d"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("50-nspawn-lifecycle.conf"), "").unwrap();
    }
    let other = host
        .path()
        .join("etc/systemd/system/systemd-nspawn@other.service.d");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("10-local.conf"), "").unwrap();
    let root = host.path().to_str().unwrap();
    let machines = |words: &[&str]| {
        let mut line = vec![NAME, "--host-root", root];
        line.extend_from_slice(words);
        let mut got: Vec<String> = bash_complete(&script, &line)
            .into_iter()
            .filter(|w| !w.starts_with('-'))
            .collect();
        got.sort();
        got
    };
    assert_eq!(machines(&["status", "k"]), ["kube1"]);
    // An option's value is not a command word (the list comes from the command line's grammar).
    assert_eq!(machines(&["status", "--format", "json", "k"]), ["kube1"]);
    assert_eq!(machines(&["plan", ""]), ["gpu2", "kube1"]);
    assert_eq!(machines(&["cdi-spec", ""]), ["gpu2", "kube1"]);
    assert_eq!(
        machines(&["nspawn-lifecycle", "pre-start", ""]),
        ["gpu2", "kube1"]
    );
    assert_eq!(machines(&["plan", "kube1", ""]), Vec::<String>::new());
    assert_eq!(machines(&["discover", ""]), Vec::<String>::new());
    // install: the images, installed or not, as machinectl lists them; uninstall: the installed.
    for image in ["kube1", "img3", "disk4.raw", ".hidden"] {
        std::fs::create_dir_all(host.path().join("var/lib/machines").join(image)).unwrap();
    }
    assert_eq!(machines(&["install", ""]), ["disk4", "img3", "kube1"]);
    assert_eq!(machines(&["install", "--dry-run", "i"]), ["img3"]);
    assert_eq!(machines(&["uninstall", ""]), ["gpu2", "kube1"]);
    let zsh = stdout_of(&["completions", "zsh"]);
    let fish = stdout_of(&["completions", "fish"]);
    for (shell, text) in [("zsh", &zsh), ("fish", &fish)] {
        assert!(
            !text.contains("cdi-hook") && !text.contains("manpages"),
            "{shell}"
        );
        assert!(
            text.contains("50-nspawn-lifecycle.conf"),
            "{shell} lists no machines"
        );
    }
    assert!(!zsh.contains("':machine -- The machine\\: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE:_default'"), "{zsh}");
}

/// The fish script in a real fish (`complete -C`, as fish completes a command line): commands,
/// and installed machines under `--host-root` after exactly the commands that take MACHINE. The
/// zsh script loads in a real zsh with compinit (zsh has no non-interactive completion call).
/// CI installs both shells (tests/run-all.sh); without them this fails, naming the package.
#[test]
fn fish_completes_machines_and_zsh_loads_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_nspawn-lifecycle-helper"),
        bin.join(NAME),
    )
    .unwrap();
    let fish_script = dir.path().join("c.fish");
    std::fs::write(&fish_script, stdout_of(&["completions", "fish"])).unwrap();
    let host = dir.path().join("host");
    for m in ["kube1", "gpu2"] {
        let d = host.join(format!("etc/systemd/system/systemd-nspawn@{m}.service.d"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("50-nspawn-lifecycle.conf"), "").unwrap();
    }
    let root = host.display().to_string();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let fish = |line: &str| -> Vec<String> {
        let out = std::process::Command::new("fish")
            .arg("--no-config")
            .arg("-c")
            .arg(format!(
                "source {}; complete -C '{line}'",
                fish_script.display()
            ))
            .env("PATH", &path)
            .output()
            .expect("fish runs (Debian package fish; tests/run-all.sh installs it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut words: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
            .collect();
        words.sort();
        words
    };
    assert_eq!(fish(&format!("{NAME} st")), ["status"]);
    assert_eq!(fish(&format!("{NAME} nspawn-lifecycle pre")), ["pre-start"]);
    assert_eq!(
        fish(&format!("{NAME} --host-root {root} status k")),
        ["kube1"]
    );
    assert_eq!(
        fish(&format!("{NAME} --host-root {root} status --format json k")),
        ["kube1"]
    );
    assert_eq!(
        fish(&format!("{NAME} --host-root={root}/ plan ")),
        ["gpu2", "kube1"]
    );
    assert_eq!(
        fish(&format!(
            "{NAME} --host-root {root} nspawn-lifecycle post-start "
        )),
        ["gpu2", "kube1"]
    );
    for image in ["kube1", "img3", "disk4.raw", ".hidden"] {
        std::fs::create_dir_all(host.join("var/lib/machines").join(image)).unwrap();
    }
    assert_eq!(
        fish(&format!("{NAME} --host-root {root} install ")),
        ["disk4", "img3", "kube1"]
    );
    assert_eq!(
        fish(&format!("{NAME} --host-root {root} uninstall ")),
        ["gpu2", "kube1"]
    );
    for no_machine in ["plan kube1 ", "discover ", "host status "] {
        let got = fish(&format!("{NAME} --host-root {root} {no_machine}"));
        assert!(
            !got.iter().any(|w| w == "kube1"),
            "{no_machine}: machines offered: {got:?}"
        );
    }
    let top = fish(&format!("{NAME} "));
    assert!(top.iter().any(|w| w == "status"), "{top:?}");
    assert!(
        !top.iter().any(|w| w == "cdi-hook" || w == "manpages"),
        "{top:?}"
    );

    let zdir = dir.path().join("zfunc");
    std::fs::create_dir_all(&zdir).unwrap();
    std::fs::write(
        zdir.join(format!("_{NAME}")),
        stdout_of(&["completions", "zsh"]),
    )
    .unwrap();
    let out = std::process::Command::new("zsh")
        .arg("-f")
        .arg("-c")
        .arg(format!(
            "autoload -U compinit && compinit -u && source {} && \
             (( $+functions[_{NAME}] && $+functions[_nspawn_lifecycle_machines] )) && \
             [[ $_comps[{NAME}] == _{NAME} ]]",
            zdir.join(format!("_{NAME}")).display()
        ))
        .output()
        .expect("zsh runs (Debian package zsh; tests/run-all.sh installs it)");
    assert!(
        out.status.success(),
        "zsh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn zsh_and_fish_completions_name_the_hooks() {
    let zsh = stdout_of(&["completions", "zsh"]);
    assert!(zsh.starts_with(&format!("#compdef {NAME}")), "{zsh}");
    let fish = stdout_of(&["completions", "fish"]);
    assert!(fish.contains(&format!("complete -c {NAME}")), "{fish}");
    for script in [&zsh, &fish] {
        for word in [
            "nspawn-lifecycle",
            "pre-start",
            "post-start",
            "reconcile",
            "install",
        ] {
            assert!(script.contains(word), "{word} missing");
        }
    }
    let out = helper(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcsh"));
}

/// A page rendered as an operator reads it (`man -l`, 100 columns), dashes plain.
fn man_text(page: &Path) -> String {
    let out = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("man (man-db) renders the pages; tests/run-all.sh installs it");
    assert!(
        out.status.success(),
        "man -l: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).replace(['\u{2010}', '\u{2212}'], "-")
}

/// The README's exit code table lists exactly the codes the man page documents.
#[test]
fn the_readme_lists_every_exit_code() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let table = readme
        .split("## Exit codes")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let listed: Vec<u8> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| ")?.split(' ').next()?.parse().ok())
        .collect();
    let documented: Vec<u8> = nspawn_lifecycle::error::EXIT_CODES
        .iter()
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(listed, documented);
}

/// The visible subcommands of the top-level page, as `--help` lists them.
const SUBCOMMANDS: [&str; 7] = [
    "nspawn-lifecycle",
    "discover",
    "plan",
    "install",
    "uninstall",
    "completions",
    "help",
];

#[test]
fn man_pages_are_written_and_render() {
    let dir = tempfile::tempdir().unwrap();
    let listed = stdout_of(&["manpages", dir.path().to_str().unwrap()]);
    // A man tree: each page in its section's directory, nothing else.
    let mut sections: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    sections.sort();
    assert_eq!(sections, ["man1", "man5"]);
    let mut names: Vec<String> = Vec::new();
    for sec in &sections {
        for e in std::fs::read_dir(dir.path().join(sec)).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(n.ends_with(&format!(".{}", &sec[3..])), "{n} in {sec}");
            names.push(n);
        }
    }
    names.sort();
    let path_of = |n: &str| {
        dir.path()
            .join(format!("man{}", n.rsplit('.').next().unwrap()))
            .join(n)
    };
    // man finds the configuration's page by its section, in this tree.
    let found = Command::new("man")
        .args(["-w", "-M"])
        .arg(dir.path())
        .args(["5", "nspawn-lifecycle.json"])
        .output()
        .expect("man (man-db)");
    assert!(
        found.status.success(),
        "man 5 nspawn-lifecycle.json: {}",
        String::from_utf8_lossy(&found.stderr)
    );
    assert_eq!(listed.lines().count(), names.len(), "{listed}");
    for want in [
        "nspawn-lifecycle-helper.1",
        "nspawn-lifecycle-helper-nspawn-lifecycle-pre-start.1",
        "nspawn-lifecycle-helper-nspawn-lifecycle-post-start.1",
        "nspawn-lifecycle-helper-nspawn-lifecycle-reconcile.1",
        "nspawn-lifecycle-helper-install.1",
        "nspawn-lifecycle-helper-completions.1",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // Only the pages: no temporary file left beside them; the configuration's in section 5.
    assert!(
        names
            .iter()
            .all(|n| (n.ends_with(".1") || n == "nspawn-lifecycle.json.5") && !n.starts_with('.')),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == "nspawn-lifecycle.json.5"),
        "{names:?}"
    );
    // Every page renders without a warning from man (what lintian's check runs), at man's width
    // without a terminal.
    for n in &names {
        let out = Command::new("man")
            .args(["--warnings", "-E", "UTF-8", "-l"])
            .arg(path_of(n))
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat")
            .output()
            .expect("man (man-db) renders the pages; tests/run-all.sh installs it");
        assert!(out.status.success(), "man -l {n}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "",
            "man --warnings on {n}"
        );
    }
    let config = man_text(&path_of("nspawn-lifecycle.json.5"));
    for (key, _, _, _) in nspawn_lifecycle::config::SETTINGS
        .iter()
        .map(|d| (d.key, d.kind, d.default, d.meaning))
    {
        assert!(
            config.contains(key),
            "{key} missing from nspawn-lifecycle.json(5)"
        );
    }
    let text = man_text(&path_of("nspawn-lifecycle-helper.1"));
    for section in [
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
        "EXAMPLES",
        "SEE ALSO",
    ] {
        assert!(
            text.contains(&format!("\n{section}\n")),
            "no {section}:\n{text}"
        );
    }
    for (code, _) in nspawn_lifecycle::error::EXIT_CODES {
        assert!(
            text.contains(&format!("\n       {code}  ")),
            "exit code {code}:\n{text}"
        );
    }
    for sub in SUBCOMMANDS {
        assert!(text.contains(sub), "{sub} missing from the page:\n{text}");
    }
    assert!(text.contains("--host-root"), "{text}");
    assert!(
        !text.contains("manpages"),
        "hidden command on the page:\n{text}"
    );
}

#[test]
fn man_pages_into_a_missing_directory_is_bad_input() {
    let out = helper(&["manpages", "/nonexistent/man1"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/man1: No such file or directory"),
        "{stderr}"
    );
    assert!(!Path::new("/nonexistent").exists());
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = helper(&["manpages", file.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(": not a directory"), "{stderr}");
}

/// The first `: `-separated segment of `line` that appears twice, if any.
fn repeated_segment(line: &str) -> Option<&str> {
    let segments: Vec<&str> = line.split(": ").collect();
    segments
        .iter()
        .enumerate()
        .find(|(i, s)| segments[..*i].contains(s))
        .map(|(_, s)| *s)
}

#[test]
fn repeated_segment_finds_the_issue_16_line() {
    let old = "error: connecting to the host's system bus: failed to connect to \
               `unix:path=/nonexistent`: No such file or directory (os error 2): No such file or \
               directory (os error 2)";
    assert_eq!(
        repeated_segment(old),
        Some("No such file or directory (os error 2)")
    );
    assert_eq!(repeated_segment("error: a: b: c"), None);
}

/// Needs root: post-start takes the machine lock under /run before it connects to the bus.
#[test]
fn privileged_no_system_bus_names_each_cause_once() {
    let machine = "cli-test-no-bus";
    // In a private mount namespace with an empty /dev: the host this test runs on may have
    // NVIDIA nodes (a stray /dev/nvidiactl made post-start stop at "incomplete", exit 3, before
    // it ever reached the bus).
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs tmpfs /dev && exec "$0" "$@""#)
        .arg(BIN)
        .args(["nspawn-lifecycle", "post-start", machine])
        .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent")
        .output()
        .expect("running the helper");
    let _ = std::fs::remove_file(format!("/run/nspawn-lifecycle/locks/{machine}.lock"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {stderr:?}"));
    assert!(
        line.contains("system bus") && line.contains("No such file or directory"),
        "{line}"
    );
    assert_eq!(repeated_segment(line), None, "{line}");
}

/// A stand-in for journald's native socket in a private mount namespace (a tmpfs over /run):
/// each datagram the helper sends is parsed (`NAME=value` lines and `NAME\n<le64 len><bytes>`)
/// and printed as one JSON object per line, until a datagram `END=1`.
const FAKE_JOURNALD: &str = r#"
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/run/systemd/journal/socket")
open(sys.argv[1], "w").close()
s.settimeout(5)
out = open(sys.argv[2], "w")
try:
    while True:
        d = s.recv(1 << 20)
        if not d:
            continue
        e, i = {}, 0
        while i < len(d):
            nl = d.index(b"\n", i)
            line = d[i:nl]
            if b"=" in line:
                k, v = line.split(b"=", 1)
                i = nl + 1
            else:
                k, (n,) = line, struct.unpack("<Q", d[nl + 1:nl + 9])
                v = d[nl + 9:nl + 9 + n]
                i = nl + 9 + n + 1
            e[k.decode()] = v.decode()
        if e.get("END") == "1":
            break
        out.write(json.dumps(e) + "\n")
        out.flush()
except socket.timeout:
    pass
"#;

/// Needs root: a private mount namespace (`unshare -m`) whose /run holds a stand-in journal
/// socket. With stderr the journal ($JOURNAL_STREAM naming fd 2), the lines go there with
/// MESSAGE= the plain line and the fields beside it; stderr stays empty. With JOURNAL_STREAM
/// naming another file (inherited, stderr redirected), the plain line goes to stderr.
#[test]
fn privileged_journal_stream_gets_the_plain_line_and_fields() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir_all(host.join("var/lib/machines/kube1/etc")).unwrap();
    std::fs::write(dir.path().join("fake-journald.py"), FAKE_JOURNALD).unwrap();
    let run = |stream_of: &str| -> (String, Vec<serde_json::Value>) {
        let ready = dir.path().join("ready");
        let got = dir.path().join("journal.jsonl");
        let stderr = dir.path().join("stderr");
        let _ = std::fs::remove_file(&ready);
        let script = format!(
            r#"set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal
python3 '{py}' '{ready}' '{got}' &
pid=$!
while [ ! -e '{ready}' ]; do sleep 0.05; done
: > '{stderr}'
export JOURNAL_STREAM=$(stat -c '%d:%i' '{stream_of}')
'{BIN}' --host-root '{host}' nspawn-lifecycle pre-start kube1 2>'{stderr}'
python3 -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"END=1\n", "/run/systemd/journal/socket")'
wait $pid
"#,
            py = dir.path().join("fake-journald.py").display(),
            ready = ready.display(),
            got = got.display(),
            stderr = stderr.display(),
            host = host.display(),
        );
        let out = Command::new("unshare")
            .args(["-m", "bash", "-c", &script])
            .output()
            .expect("running unshare");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let entries = std::fs::read_to_string(&got)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (std::fs::read_to_string(&stderr).unwrap(), entries)
    };

    let (stderr, entries) = run(&dir.path().join("stderr").display().to_string());
    assert_eq!(stderr, "", "stderr is the journal: nothing printed there");
    let nspawn = host.join("etc/systemd/nspawn/kube1.nspawn");
    let line = entries
        .iter()
        .find(|e| e["MACHINE"] == "kube1" && e["STEP"] == "nspawn")
        .unwrap_or_else(|| panic!("no entry with MACHINE=kube1 STEP=nspawn in {entries:?}"));
    let message = line["MESSAGE"].as_str().unwrap();
    let us = line["US"].as_str().unwrap();
    assert!(
        us.parse::<u64>().is_ok()
            && message.starts_with(&format!(" INFO {}: ", nspawn.display()))
            && message.ends_with(&format!(" machine=kube1 step=nspawn us={us}")),
        "MESSAGE is not the plain line: {message:?}"
    );
    assert_eq!(line["SYSLOG_IDENTIFIER"], NAME);
    assert_eq!(line["PRIORITY"], "6");
    assert!(
        !line
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("F_")),
        "{line}"
    );

    // The variable names some other file: plain text on stderr, nothing to the journal.
    let (stderr, entries) = run("/proc/self/exe");
    assert!(entries.is_empty(), "{entries:?}");
    assert!(
        stderr.contains(&format!(
            " INFO {}: unchanged machine=kube1 step=nspawn us=",
            nspawn.display()
        )),
        "{stderr}"
    );
}

/// A typo in the log filter is an error naming it (it used to be read as a target name and
/// silence every line, exit 0); `-q` and `-v` together are a usage error.
#[test]
fn a_log_filter_typo_and_quiet_with_verbose_are_usage_errors() {
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .env("NSPAWN_LIFECYCLE_LOG", "inf")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        "error: NSPAWN_LIFECYCLE_LOG=\"inf\": \"inf\" is not a level (trace, debug, info, warn, \
         error, off) or target=level\n"
    );
    let out = helper(&["-q", "-v", "completions", "bash"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = helper(&["-q", "completions", "bash"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// With `--json`, a command line clap refuses prints one error object on stdout (the schema
/// test checks its fields) and clap's own message on stderr, exit 2; without `--json`, or with
/// it after `--`, stdout stays empty. Help is help, not an error.
#[test]
fn usage_errors_of_json_lines_are_json() {
    let out = helper(&["discover", "--json", "--bogus"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "DiscoverError");
    assert_eq!(v["exitCode"], 2);
    let error = v["error"].as_str().unwrap();
    assert!(
        error.starts_with("unexpected argument '--bogus' found"),
        "{error}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: unexpected argument '--bogus' found"),
        "{err}"
    );
    for args in [
        &["discover", "--bogus"][..],
        &["install", "--dry-run", "--", "--json"],
        &["plan", "--json", "--help"],
    ] {
        let out = helper(args);
        let code = if args.contains(&"--help") { 0 } else { 2 };
        assert_eq!(out.status.code(), Some(code), "{args:?}: {out:?}");
        assert!(
            code == 0 || out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("apiVersion"),
            "{args:?}"
        );
    }
}

/// `--version` says what was built: the version, the git commit (and whether the tree had
/// uncommitted changes), the profile and the target; `-V` stays the one short line scripts parse.
#[test]
fn version_names_the_commit_profile_and_target() {
    let long = stdout_of(&["--version"]);
    let lines: Vec<&str> = long.lines().collect();
    assert_eq!(lines.len(), 3, "{long}");
    assert_eq!(lines[0], format!("{NAME} {}", env!("CARGO_PKG_VERSION")));
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    // The suite runs in a checkout (CI's is a clone): no commit to compare with is a failure,
    // not a pass of "starts with `commit `".
    assert!(
        head.status.success(),
        "git rev-parse HEAD: {}",
        String::from_utf8_lossy(&head.stderr)
    );
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert_eq!(head.len(), 12, "{head:?}");
    assert!(lines[1].starts_with(&format!("commit {head}")), "{long}");
    assert!(lines[2].starts_with("profile "), "{long}");
    assert!(
        lines[2].contains(", target x86_64-") || lines[2].contains(", target aarch64-"),
        "{long}"
    );
    assert_eq!(
        stdout_of(&["-V"]),
        format!("{NAME} {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// The operator's spelling `reconcile MACHINE` is the hook namespace's, and MACHINE is explained.
#[test]
fn reconcile_is_a_top_level_command_and_machine_has_help() {
    for args in [
        &["reconcile", "--help"][..],
        &["nspawn-lifecycle", "reconcile", "--help"],
    ] {
        let text = stdout_of(args);
        assert!(
            text.contains("<MACHINE>  The machine: systemd-nspawn@MACHINE.service"),
            "{args:?}: {text}"
        );
    }
}

/// Log lines are coloured only for a person at a terminal, and never with `NO_COLOR` set: the
/// same debug lines through a pseudo-terminal (util-linux's `script`), through it with
/// `NO_COLOR=1`, and through a pipe.
#[test]
fn colour_only_at_a_terminal_and_never_with_no_color() {
    let host = tempfile::tempdir().unwrap();
    let cmd = format!("{BIN} --host-root {} -vv discover", host.path().display());
    let at_terminal = |no_color: bool| {
        let mut c = Command::new("script");
        c.args(["-qec", &cmd, "/dev/null"]).env_remove("NO_COLOR");
        if no_color {
            c.env("NO_COLOR", "1");
        }
        let out = c.output().expect("util-linux's script");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let coloured = at_terminal(false);
    assert!(coloured.contains("DEBUG"), "{coloured}");
    assert!(
        coloured.contains("\u{1b}["),
        "no colour at a terminal: {coloured:?}"
    );
    let plain = at_terminal(true);
    assert!(plain.contains("DEBUG"), "{plain}");
    assert!(
        !plain.contains('\u{1b}'),
        "colour with NO_COLOR=1: {plain:?}"
    );
    let piped = Command::new(BIN)
        .args([
            "--host-root",
            &host.path().display().to_string(),
            "-vv",
            "discover",
        ])
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let piped = String::from_utf8_lossy(&piped.stderr);
    assert!(piped.contains("DEBUG"), "{piped}");
    assert!(!piped.contains('\u{1b}'), "colour into a pipe: {piped:?}");
}

/// A reader that went away (`| head`) or a closed stdout: never a panic (the release build
/// aborts on one), one behaviour for every printing command: it ends quietly, exit 0. The pipe's
/// read end is closed before the helper starts, so every write meets EPIPE.
#[test]
fn a_gone_reader_or_closed_stdout_ends_quietly() {
    let host = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(host.path().join("var/lib/machines/kube1")).unwrap();
    let pages = tempfile::tempdir().unwrap();
    let root = host.path().display().to_string();
    let dir = pages.path().display().to_string();
    for args in [
        vec!["--host-root", &root, "install", "kube1", "--print-dropin"],
        vec!["manpages", &dir],
        vec!["completions", "bash"],
        vec!["--host-root", &root, "discover"],
        vec!["--host-root", &root, "discover", "--json"],
    ] {
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(r);
        let out = Command::new(BIN)
            .args(&args)
            .stdout(std::process::Stdio::from(w))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.is_empty(),
            "{args:?} into a pipe nobody reads: {:?} {err}",
            out.status
        );
        let out = Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" >&-")
            .arg(BIN)
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("panicked"),
            "{args:?} with stdout closed: {:?} {err}",
            out.status
        );
    }
}

/// A machine name is what systemd-nspawn accepts, no more: the real `systemd-nspawn --machine=`
/// (Debian's systemd-container, installed by tests/run-all.sh) is the oracle, name by name;
/// `install` of a name it refuses is exit 2 naming it, before anything is written.
#[test]
fn machine_names_are_what_systemd_nspawn_accepts() {
    let host = tempfile::tempdir().unwrap();
    let root = host.path().display().to_string();
    for name in [
        "kube1",
        "a.b",
        "gpu-node-01",
        "0node",
        "a..b",
        "a.",
        ".a",
        "-x",
        "x-",
        "a.-b",
        "gpu_node",
        "a b",
        "ä",
    ] {
        let nspawn = Command::new("systemd-nspawn")
            .arg(format!("--machine={name}"))
            .args(["-D", "/nonexistent/root", "true"])
            .output()
            .expect("systemd-nspawn (Debian's systemd-container)");
        let nspawn_refuses =
            String::from_utf8_lossy(&nspawn.stderr).contains("Invalid machine name");
        let out = Command::new(BIN)
            .args(["--host-root", &root, "install", "--dry-run", "--", name])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // Our refusal names the machine name (`machine name "…"`); whatever else a dry run on
        // an empty host says is not about the name.
        let we_refuse = err.contains(&format!("machine name \"{}\"", name.escape_debug()));
        assert_eq!(
            we_refuse, nspawn_refuses,
            "{name:?}: exit {:?}: {err}",
            out.status
        );
        if we_refuse {
            assert_eq!(out.status.code(), Some(2), "{name:?}: {err}");
        }
    }
    assert_eq!(
        std::fs::read_dir(host.path()).unwrap().count(),
        0,
        "install wrote"
    );
}

/// A message that tells where to change a setting names the configuration file actually in use:
/// `--config FILE`'s, not the default path.
#[test]
fn messages_name_the_config_file_given() {
    let host = tempfile::tempdir().unwrap();
    let cfg = host.path().join("other.json");
    std::fs::write(&cfg, "{}\n").unwrap();
    let out = Command::new(BIN)
        .arg("--host-root")
        .arg(host.path())
        .arg("--config")
        .arg(&cfg)
        .args(["plan", "kube9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no machine image found"), "{err}");
    assert!(
        err.contains(&format!("machines.kube9.directory in {}", cfg.display())),
        "{err}"
    );
    assert!(!err.contains("/etc/nspawn-lifecycle/config.json"), "{err}");
}

/// The pages say what the code does: staged tarballs are kept (imported again at every start),
/// and uninstall keeps the `.nspawn` file, without GPU binds.
#[test]
fn help_and_pages_say_what_the_code_does() {
    let dir = tempfile::tempdir().unwrap();
    stdout_of(&["manpages", dir.path().to_str().unwrap()]);
    let page = std::fs::read_to_string(dir.path().join("man5/nspawn-lifecycle.json.5")).unwrap();
    assert!(!page.contains("then removes"), "stagedImagesDir: {page}");
    assert!(page.contains("imports with ctr at every start"), "{page}");
    let help = stdout_of(&["uninstall", "--help"]);
    assert!(
        help.contains("rewrite its .nspawn file without GPU binds"),
        "{help}"
    );
    assert!(!help.contains("rendered .nspawn file, and"), "{help}");
}
