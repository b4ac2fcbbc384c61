//! Man pages and shell completions, generated from the clap definition in [`crate::cli`] so they
//! never drift from the command line they describe.

use crate::cli::{Cli, Shell};
use anyhow::{Context as _, Result};
use clap::CommandFactory as _;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where `install` puts a machine's drop-in: the completions list the installed machines from
/// these names (`systemd-nspawn@<machine>.service.d/50-nspawn-lifecycle.conf`).
const DROPIN_GLOB: &str = "/etc/systemd/system/systemd-nspawn@*.service.d/50-nspawn-lifecycle.conf";

/// Where `install` finds a machine's image: its MACHINE completes from the images there, installed
/// or not, as `machinectl list-images` lists them (a directory, or `NAME.raw`; no hidden ones).
const IMAGES: &str = "/var/lib/machines";

/// Write the completion script for `shell` to `out`: the visible commands only, and the
/// installed machines where a command takes MACHINE.
pub fn completions(shell: Shell, out: &mut dyn Write) -> Result<()> {
    let mut cmd = visible(&Cli::command());
    let name = cmd.get_name().to_owned();
    let mut script = Vec::new();
    match shell {
        Shell::Bash => {
            // clap_complete's bash script spells its state labels two ways when the binary's
            // name has a hyphen (clap-rs/clap#6421), so nothing completes past the first word.
            // Generated for a hyphen-free name, then registered for the real one.
            let alias = name.replace('-', "_");
            clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, &alias, &mut script);
            let text = String::from_utf8(script).context("the bash completion script")?;
            script = register_for(&text, &alias, &name, &Grammar::of(&cmd)).into_bytes();
        }
        Shell::Zsh => {
            clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, &name, &mut script);
            let text = String::from_utf8(script).context("the zsh completion script")?;
            script = zsh_machines(&text).into_bytes();
        }
        Shell::Fish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, &name, &mut script);
            script.extend_from_slice(fish_machines(&cmd, &name).as_bytes());
        }
    }
    out.write_all(&script)
        .and_then(|()| out.flush())
        .context("writing the completion script")
}

/// `cmd` without its hidden subcommands (the hooks' plumbing, packaging), which clap_complete
/// would offer: the name, version, arguments and the visible subcommands, recursively.
fn visible(cmd: &clap::Command) -> clap::Command {
    let name: &'static str = Box::leak(cmd.get_name().to_owned().into_boxed_str());
    let mut out = clap::Command::new(name).args(cmd.get_arguments().cloned());
    if let Some(v) = cmd.get_version() {
        let v: &'static str = Box::leak(v.to_owned().into_boxed_str());
        out = out.version(v);
    }
    if let Some(a) = cmd.get_about() {
        out = out.about(a.clone());
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(visible(sub));
    }
    out
}

/// The bash function that adds the installed machines (under `--host-root`, when the command
/// line gives one) where a command takes MACHINE.
const BASH_MACHINES: &str = r#"
_nspawn_lifecycle_helper_with_machines() {
    _nspawn_lifecycle_helper "$@"
    local cur=${COMP_WORDS[COMP_CWORD]} i w root="" words=() f m
    [[ $cur == -* ]] && return 0
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
            --host-root) root=${COMP_WORDS[i + 1]}; ((i++)) ;;
            --host-root=*) root=${w#*=} ;;
            @VALUE_OPTIONS@) ((i++)) ;;
            -*) ;;
            *) words+=("$w") ;;
        esac
    done
    case "${words[*]}" in
        @MACHINE_COMMANDS@) ;;
        *) return 0 ;;
    esac
    if [[ ${words[*]} == install ]]; then
        for f in "${root%/}"@IMAGES@/*; do
            [[ -e $f ]] || continue
            m=${f##*/}
            m=${m%.raw}
            [[ $m == "$cur"* ]] && COMPREPLY+=("$m")
        done
        return 0
    fi
    for f in "${root%/}"@GLOB@; do
        [[ -e $f ]] || continue
        m=${f#"${root%/}/etc/systemd/system/systemd-nspawn@"}
        m=${m%%.service.d/*}
        [[ $m == "$cur"* ]] && COMPREPLY+=("$m")
    done
    return 0
}
"#;

/// zsh: MACHINE completes from the installed machines; `install`'s, from the images.
fn zsh_machines(script: &str) -> String {
    let func = format!(
        "_nspawn_lifecycle_machines() {{\n    local -a m\n    \
         if (( ${{words[(I)install]}} )); then\n        \
         m=({IMAGES}/*(N:t))\n        m=(${{m%.raw}})\n    else\n        \
         m=({DROPIN_GLOB}(N))\n        \
         m=(${{${{m#/etc/systemd/system/systemd-nspawn@}}%%.service.d/*}})\n    fi\n    \
         compadd -a m\n}}\n\n"
    );
    let mut out = String::new();
    for line in script.lines() {
        let is_machine = line.starts_with("':machine -- ") || line.starts_with("'::machine -- ");
        match (is_machine, line.strip_suffix(":_default' \\")) {
            (true, Some(head)) => out.push_str(&format!("{head}:_nspawn_lifecycle_machines' \\\n")),
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    // Defined before the block at the end that runs or registers the completion function.
    match out.find("\nif [ \"$funcstack[1]\"") {
        Some(at) => format!("{}\n{func}{}", &out[..at], &out[at + 1..]),
        None => format!("{func}{out}"),
    }
}

/// fish: MACHINE completes from the installed machines (under `--host-root`, when the command
/// line gives one), after exactly the commands that take one, as in bash.
fn fish_machines(cmd: &clap::Command, name: &str) -> String {
    let g = Grammar::of(cmd);
    FISH_MACHINES
        .replace("@NAME@", name)
        .replace("@GLOB@", DROPIN_GLOB.trim_start_matches('/'))
        .replace("@IMAGES@", IMAGES)
        .replace("@VALUE_OPTIONS@", &g.value_options.join(" "))
        .replace("@MACHINE_COMMANDS@", &g.quoted_commands(" "))
}

/// What the machine completion of bash and fish needs to know of the command line, read from
/// its clap definition so neither script can miss a command or an option.
struct Grammar {
    /// The commands that take MACHINE, as the words that name them (`nspawn-lifecycle pre-start`).
    machine_commands: Vec<String>,
    /// The long options that take a value (skipped with it), but `--host-root`, which the
    /// scripts read.
    value_options: Vec<String>,
}

impl Grammar {
    fn of(cmd: &clap::Command) -> Grammar {
        let mut g = Grammar {
            machine_commands: Vec::new(),
            value_options: Vec::new(),
        };
        g.walk(cmd, "");
        g.value_options.sort();
        g.value_options.dedup();
        g
    }

    /// The value options of the top level (global) and of each command that takes MACHINE:
    /// the only ones that can stand before it.
    fn walk(&mut self, cmd: &clap::Command, words: &str) {
        let takes_machine = cmd
            .get_arguments()
            .any(|a| a.is_positional() && a.get_id() == "machine");
        if takes_machine || words.is_empty() {
            for arg in cmd.get_arguments() {
                if let Some(long) = arg.get_long()
                    && arg.get_action().takes_values()
                    && long != "host-root"
                {
                    self.value_options.push(format!("--{long}"));
                }
            }
        }
        if takes_machine {
            self.machine_commands.push(words.to_owned());
        }
        for sub in cmd.get_subcommands() {
            let words = match words {
                "" => sub.get_name().to_owned(),
                w => format!("{w} {}", sub.get_name()),
            };
            self.walk(sub, &words);
        }
    }

    /// The commands, each in double quotes, joined by `sep`.
    fn quoted_commands(&self, sep: &str) -> String {
        self.machine_commands
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(sep)
    }
}

const FISH_MACHINES: &str = r#"
function __@NAME@_words
    set -l skip 0
    for w in (commandline -opc)[2..-1]
        if test $skip = 1
            set skip 0
            continue
        end
        switch $w
            case --host-root @VALUE_OPTIONS@
                set skip 1
            case '-*'
            case '*'
                echo $w
        end
    end
end
function __@NAME@_machine_wanted
    set -l words (__@NAME@_words)
    contains -- "$words" @MACHINE_COMMANDS@
end
function __@NAME@_machines
    set -l words (__@NAME@_words)
    set -l root ""
    set -l args (commandline -opc)
    for i in (seq (count $args))
        switch $args[$i]
            case --host-root
                set root $args[(math $i + 1)]
            case '--host-root=*'
                set root (string replace -- --host-root= '' $args[$i])
        end
    end
    set root (string replace -r -- '/+$' '' $root)
    if test "$words" = install
        for f in $root@IMAGES@/*
            string replace -r -- '^.*/([^/]*?)(\.raw)?$' '$1' $f
        end
        return
    end
    for f in $root/@GLOB@
        string replace -r -- '^.*/systemd-nspawn@(.*)\.service\.d/[^/]*$' '$1' $f
    end
end
complete -c @NAME@ -n __@NAME@_machine_wanted -f -a "(__@NAME@_machines)"
"#;

/// `script` with its `complete … ALIAS` lines registering, for `name` instead, the function
/// that also completes machine names ([`BASH_MACHINES`]).
fn register_for(script: &str, alias: &str, name: &str, g: &Grammar) -> String {
    let suffix = format!(" {alias}");
    let generated = format!("-F _{alias} ");
    let ours = format!("-F _{alias}_with_machines ");
    let mut out: String = script
        .lines()
        .map(|line| match line.trim_start().starts_with("complete ") {
            true => match line.strip_suffix(&suffix) {
                Some(head) => format!("{} {name}\n", head.replace(&generated, &ours)),
                None => format!("{line}\n"),
            },
            false => format!("{line}\n"),
        })
        .collect();
    out.push_str(
        &BASH_MACHINES
            .replace("@GLOB@", DROPIN_GLOB)
            .replace("@IMAGES@", IMAGES)
            .replace("@VALUE_OPTIONS@", &g.value_options.join(" | "))
            .replace("@MACHINE_COMMANDS@", &g.quoted_commands(" | ")),
    );
    out
}

/// The man pages: a file name (`nspawn-lifecycle-helper-install.1`) and its roff text for the
/// command and every visible subcommand, depth first.
pub fn pages() -> Result<Vec<(String, Vec<u8>)>> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    collect(cmd, &mut pages)?;
    pages.push((
        CONFIG_PAGE.to_owned(),
        breakable_paths(&config_page()).into_bytes(),
    ));
    Ok(pages)
}

/// The configuration file's page (section 5).
const CONFIG_PAGE: &str = "nspawn-lifecycle.json.5";

/// `s` as roff text: backslashes and hyphens escaped, a leading `.` or `'` made literal.
fn roff(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// A `.TP` item: `tag` in bold, `text` below it.
fn item(tag: &str, text: &str) -> String {
    format!(".TP\n\\fB{}\\fR\n{}\n", roff(tag), roff(text))
}

/// The sections the top page adds to what clap_mangen renders from the command line.
fn top_page_sections() -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in crate::error::EXIT_CODES {
        out.push_str(&item(&code.to_string(), meaning));
    }
    out.push_str(".SH ENVIRONMENT\n");
    out.push_str(&item(
        "NSPAWN_LIFECYCLE_LOG",
        "Log filter (tracing's syntax: error, warn, info, debug, trace, per module too); overrides -v and -q. An invalid filter is exit 2. The cdi-hook commands read no environment at all.",
    ));
    out.push_str(&item("NO_COLOR", "Set: no colour in log lines."));
    out.push_str(".SH FILES\n");
    for (path, what) in [
        (
            crate::config::DEFAULT_PATH,
            "The optional configuration, see nspawn-lifecycle.json(5).",
        ),
        (
            crate::config::DEFAULT_HELPER_PATH,
            "The helper the units run (install puts it there; the configuration's helperPath moves it).",
        ),
        (
            "/etc/systemd/system/systemd-nspawn@MACHINE.service.d/",
            "50-nspawn-lifecycle.conf there is the drop-in install writes: the hooks, the restart policy, the device cgroup.",
        ),
        (
            "/etc/systemd/nspawn/MACHINE.nspawn",
            "The machine's settings, rendered by pre-start at every start.",
        ),
        (
            crate::model::layout::TREE_HOST_DIR,
            "Each machine's driver tree, bound read-only at /run/nvidia/driver in the machine.",
        ),
        (
            "/run/nspawn-lifecycle/",
            "Locks and the unit gate's markers.",
        ),
        (
            "/var/run/cdi/nvidia.com-gpu.json",
            "In the machine: the CDI spec post-start writes.",
        ),
    ] {
        out.push_str(&item(path, what));
    }
    out.push_str(".SH EXAMPLES\n");
    for (cmd, what) in [
        (
            "nspawn-lifecycle-helper install kube1",
            "Wire the machine kube1's unit; the next start runs the hooks.",
        ),
        (
            "nspawn-lifecycle-helper plan kube1 --exit-code",
            "Show what pre-start would write; exit 9 if it would change the file.",
        ),
        (
            "nspawn-lifecycle-helper status --all --json",
            "Judge every installed machine, one JSON object.",
        ),
        (
            "nspawn-lifecycle-helper reconcile kube1",
            "Restart the machine so both hooks run again.",
        ),
    ] {
        out.push_str(&item(cmd, what));
    }
    out.push_str(".SH \"SEE ALSO\"\n");
    out.push_str("\\fBnspawn\\-lifecycle.json\\fR(5), \\fBsystemd\\-nspawn\\fR(1), \\fBsystemd.nspawn\\fR(5), \\fBsystemctl\\fR(1)\n");
    out
}

/// `nspawn-lifecycle.json(5)`: every key of the configuration file, from [`crate::config::SETTINGS`].
fn config_page() -> String {
    let mut out = format!(
        ".TH NSPAWN\\-LIFECYCLE.JSON 5 \"\" \"nspawn\\-lifecycle\\-helper {}\" \"File Formats\"\n",
        env!("CARGO_PKG_VERSION")
    );
    out.push_str(
        ".SH NAME\nnspawn\\-lifecycle.json \\- configuration of nspawn\\-lifecycle\\-helper\n",
    );
    out.push_str(&format!(
        ".SH SYNOPSIS\n{}\n",
        roff(crate::config::DEFAULT_PATH)
    ));
    out.push_str(".SH DESCRIPTION\n");
    out.push_str(&roff("Optional: without the file every machine gets the defaults below. A JSON object; --config FILE reads another file, which must then exist. Top-level keys: helperPath (absolute path of the helper the units run, default "));
    out.push_str(&roff(crate::config::DEFAULT_HELPER_PATH));
    out.push_str(&roff("), defaults (settings for every machine), machines (an object of machine name to settings, over the defaults) and host (host mode's settings alone)."));
    out.push_str("\n.SH SETTINGS\n");
    for d in crate::config::SETTINGS {
        out.push_str(&item(
            d.key,
            &format!("{} (default {}). {}", d.kind, d.default, d.meaning),
        ));
    }
    out.push_str(".SH REFUSED\n");
    out.push_str(&roff("Each of these is exit 2, naming the file and the key, and nothing is written: a file that is not a JSON object, or a value that is not an object where keys belong (an array is never read by position); an unknown key; a wrong type; a relative path; a mount source missing on the host or a target that could leave the machine; a unit or capability name that is not one; two machines whose gpus lists name one GPU; a machine-only key (directory, mounts, dropCapabilities, gpus, require, bootTimeoutSeconds, containerdAtBoot) under host; a configuration path that is a dangling link, a directory or unreadable (only a file that does not exist means defaults)."));
    out.push_str("\n.SH EXAMPLE\n.nf\n");
    out.push_str(&roff(r#"{"defaults": {"jobTimeoutSeconds": 120}, "machines": {"kube1": {"gpus": ["GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01"], "require": true}}}"#));
    out.push_str("\n.fi\n.SH \"SEE ALSO\"\n\\fBnspawn\\-lifecycle\\-helper\\fR(1)\n");
    out
}

fn collect(cmd: clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub.clone(), pages)?;
    }
    let top = cmd.get_bin_name().is_none_or(|b| !b.contains(' '));
    let man = clap_mangen::Man::new(cmd);
    let mut roff = Vec::new();
    let rendered = if top {
        // The top page: clap_mangen's sections, then ours, then the version.
        man.render_title(&mut roff)
            .and_then(|()| man.render_name_section(&mut roff))
            .and_then(|()| man.render_synopsis_section(&mut roff))
            .and_then(|()| man.render_description_section(&mut roff))
            .and_then(|()| man.render_options_section(&mut roff))
            .and_then(|()| man.render_subcommands_section(&mut roff))
            .and_then(|()| roff.write_all(top_page_sections().as_bytes()))
            .and_then(|()| man.render_version_section(&mut roff))
    } else {
        man.render(&mut roff)
    };
    rendered.with_context(|| format!("rendering {}", man.get_filename()))?;
    let text = String::from_utf8(roff).context("the rendered page")?;
    pages.push((man.get_filename(), breakable_paths(&text).into_bytes()));
    Ok(())
}

/// `page` with a break point (`\:`, invisible) after each `/` and `_` of its text lines, so long
/// paths and metric names can wrap instead of overrunning the line (`man --warnings`).
fn breakable_paths(page: &str) -> String {
    let mut out = String::new();
    for l in page.lines() {
        if l.starts_with('.') || l.starts_with('\'') {
            out.push_str(l);
        } else {
            out.push_str(&l.replace('/', "/\\:").replace('_', "_\\:"));
        }
        out.push('\n');
    }
    out
}

/// Write every man page into the man tree `dir` (which must exist): `dir/man1/*.1`,
/// `dir/man5/*.5`, each replaced atomically. Returns the paths written.
pub fn write_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(crate::error::bad_input(format!(
                "manpages {}: not a directory",
                dir.display()
            )));
        }
        Err(e) => {
            return Err(crate::error::bad_input(format!(
                "manpages {}: {e} (it must be an existing directory)",
                dir.display()
            )));
        }
    }
    let mut written = Vec::new();
    for (name, roff) in pages()? {
        // A man tree: each page in the directory of its section (`man1/`, `man5/`), so that
        // `man 5 nspawn-lifecycle.json` finds the configuration's page.
        let section = name.rsplit('.').next().unwrap_or("1");
        let sub = dir.join(format!("man{section}"));
        fs_err::create_dir_all(&sub)?;
        let path = sub.join(&name);
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .tempfile_in(&sub)
            .with_context(|| format!("creating a temporary file in {}", sub.display()))?;
        tmp.write_all(&roff)
            .and_then(|()| tmp.as_file().sync_all())
            .with_context(|| format!("writing {}", path.display()))?;
        tmp.persist(&path)
            .map_err(|e| e.error)
            .with_context(|| format!("renaming into {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_visible_command() {
        let names: Vec<String> = pages().unwrap().into_iter().map(|(n, _)| n).collect();
        for want in [
            "nspawn-lifecycle-helper.1",
            "nspawn-lifecycle-helper-nspawn-lifecycle.1",
            "nspawn-lifecycle-helper-nspawn-lifecycle-pre-start.1",
            "nspawn-lifecycle-helper-nspawn-lifecycle-post-start.1",
            "nspawn-lifecycle-helper-nspawn-lifecycle-reconcile.1",
            "nspawn-lifecycle-helper-install.1",
            "nspawn-lifecycle-helper-completions.1",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        assert!(!names.iter().any(|n| n.contains("manpages")), "{names:?}");
    }

    #[test]
    fn a_missing_directory_is_bad_input() {
        let err = write_pages(Path::new("/nonexistent/man1")).unwrap_err();
        assert_eq!(crate::error::exit_code(&err), 2);
        assert!(format!("{err:#}").contains("/nonexistent/man1"), "{err:#}");
    }
}
