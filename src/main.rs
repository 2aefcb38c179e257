//! The `svcgate` binary: parses the command line and hands over to the library.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    svcgate::cli::run(svcgate::cli::Cli::parse())
}
