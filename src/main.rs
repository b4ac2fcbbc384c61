use clap::Parser as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = nspawn_lifecycle::cli::Cli::parse();
    // A CDI hook runs on what a pod controls: nothing of its environment or working directory
    // may reach logging or anything after it.
    if let nspawn_lifecycle::cli::Command::CdiHook(_) = cli.command
        && let Err(err) = nspawn_lifecycle::apply::cdi_hook::isolate_process()
    {
        eprintln!("error: {err:#}");
        return ExitCode::from(1);
    }
    if let Err(e) = nspawn_lifecycle::logging::init(cli.verbose, cli.quiet) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    match nspawn_lifecycle::commands::run_with_code(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // Messages name what machines and pods wrote: escaped before a terminal sees them.
            let text = format!("{err:#}");
            eprintln!(
                "error: {}",
                nspawn_lifecycle::output::printable_lines(&text)
            );
            ExitCode::from(nspawn_lifecycle::error::exit_code(&err))
        }
    }
}
