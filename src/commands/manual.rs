//! Man pages and shell completions, generated from the clap definition in [`crate::cli`] so they
//! never drift from the command line they describe.

use crate::cli::{Cli, Shell};
use anyhow::{Context as _, Result};
use clap::CommandFactory as _;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write the completion script for `shell` to `out`.
pub fn completions(shell: Shell, out: &mut dyn Write) -> Result<()> {
    let mut cmd = Cli::command();
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
            clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, &name, &mut script)
        }
        Shell::Fish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, &name, &mut script)
        }
    }
    out.write_all(&script)
        .and_then(|()| out.flush())
        .context("writing the completion script")
}

/// `script` with its `complete … ALIAS` lines registering the function for `name` instead.
fn register_for(script: &str, alias: &str, name: &str) -> String {
    let suffix = format!(" {alias}");
    script
        .lines()
        .map(|line| match line.trim_start().starts_with("complete ") {
            true => match line.strip_suffix(&suffix) {
                Some(head) => format!("{head} {name}\n"),
                None => format!("{line}\n"),
            },
            false => format!("{line}\n"),
        })
        .collect()
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
