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
            script = register_for(&text, &alias, &name).into_bytes();
        }
        Shell::Zsh => {
            clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, &name, &mut script);
            let text = String::from_utf8(script).context("the zsh completion script")?;
            script = zsh_machines(&text).into_bytes();
        }
        Shell::Fish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, &name, &mut script);
            script.extend_from_slice(fish_machines(&name).as_bytes());
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
            --config | --machine-root) ((i++)) ;;
            -*) ;;
            *) words+=("$w") ;;
        esac
    done
    case "${words[*]}" in
        plan | status | install | uninstall | reconcile | "nspawn-lifecycle pre-start" |             "nspawn-lifecycle post-start" | "nspawn-lifecycle reconcile") ;;
        *) return 0 ;;
    esac
    for f in "${root%/}"@GLOB@; do
        [[ -e $f ]] || continue
        m=${f#"${root%/}/etc/systemd/system/systemd-nspawn@"}
        m=${m%%.service.d/*}
        [[ $m == "$cur"* ]] && COMPREPLY+=("$m")
    done
    return 0
}
"#;

/// zsh: MACHINE completes from the installed machines.
fn zsh_machines(script: &str) -> String {
    let func = format!(
        "_nspawn_lifecycle_machines() {{\n    local -a m\n    m=({DROPIN_GLOB}(N))\n    \
         m=(${{${{m#/etc/systemd/system/systemd-nspawn@}}%%.service.d/*}})\n    \
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

/// fish: MACHINE completes from the installed machines.
fn fish_machines(name: &str) -> String {
    format!(
        "complete -c {name} -n \"__fish_seen_subcommand_from plan status install uninstall \
         reconcile pre-start post-start\" -f -a \"(for f in {DROPIN_GLOB}; string replace -r \
         '^/etc/systemd/system/systemd-nspawn@(.*)\\.service\\.d/.*' '$1' $f; end)\"\n"
    )
}

/// `script` with its `complete … ALIAS` lines registering, for `name` instead, the function
/// that also completes machine names ([`BASH_MACHINES`]).
fn register_for(script: &str, alias: &str, name: &str) -> String {
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
    out.push_str(&BASH_MACHINES.replace("@GLOB@", DROPIN_GLOB));
    out
}

/// The man pages: a file name (`nspawn-lifecycle-helper-install.1`) and its roff text for the
/// command and every visible subcommand, depth first.
pub fn pages() -> Result<Vec<(String, Vec<u8>)>> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    collect(cmd, &mut pages)?;
    Ok(pages)
}

fn collect(cmd: clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub.clone(), pages)?;
    }
    let man = clap_mangen::Man::new(cmd);
    let mut roff = Vec::new();
    man.render(&mut roff)
        .with_context(|| format!("rendering {}", man.get_filename()))?;
    pages.push((man.get_filename(), roff));
    Ok(())
}

/// Write every man page into `dir` (which must exist), each replaced atomically. Returns the
/// paths written.
pub fn write_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Err(crate::error::bad_input(format!(
            "manpages {}: not a directory",
            dir.display()
        )));
    }
    let mut written = Vec::new();
    for (name, roff) in pages()? {
        let path = dir.join(&name);
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .tempfile_in(dir)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
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
