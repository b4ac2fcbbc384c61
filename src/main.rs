use clap::Parser as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = nspawn_lifecycle::cli::Cli::parse();
    nspawn_lifecycle::logging::init(cli.verbose);
    match nspawn_lifecycle::commands::run_with_code(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(nspawn_lifecycle::error::exit_code(&err))
        }
    }
}
