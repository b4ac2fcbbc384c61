use clap::Parser as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = nspawn_lifecycle::cli::Cli::parse();
    nspawn_lifecycle::init_logging(cli.verbose);
    match nspawn_lifecycle::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(nspawn_lifecycle::error::exit_code(&err))
        }
    }
}
