use clap::Parser as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match nspawn_lifecycle::cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            // A usage error of a `--json` line is one JSON object too (exit 2, as clap's).
            if e.use_stderr()
                && let Some(u) = nspawn_lifecycle::cli::json_usage(&args)
            {
                let text = e.render().to_string();
                let text = text.trim_end();
                let err = nspawn_lifecycle::error::bad_input(
                    text.strip_prefix("error: ").unwrap_or(text),
                );
                let _ =
                    nspawn_lifecycle::output::print_error_object(u.kind, u.machine, u.state, err);
            }
            e.exit()
        }
    };
    // A CDI hook runs on what a pod controls: nothing of its environment or working directory
    // may reach logging or anything after it.
    if let nspawn_lifecycle::cli::Command::CdiHook(_) = cli.command
        && let Err(err) = nspawn_lifecycle::apply::cdi_hook::isolate_process()
    {
        eprintln!("error: {err:#}");
        return ExitCode::from(1);
    }
    if let Err(e) = nspawn_lifecycle::logging::init(cli.verbose, cli.quiet) {
        let e = nspawn_lifecycle::commands::json_failure(
            &cli.command,
            nspawn_lifecycle::error::bad_input(format!("{e:#}")),
        );
        eprintln!("error: {e:#}");
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
