use clap::Parser;

fn main() -> std::process::ExitCode {
    match burnpose::cli::run(burnpose::cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
