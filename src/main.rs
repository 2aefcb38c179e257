//! The `svcgate` binary: parses the command line and hands over to the library.

use clap::Parser;
use std::process::ExitCode;

/// mimalloc rather than the system allocator: the request path allocates small, short-lived
/// buffers on every request, and glibc's malloc cost about a tenth of the gateway's CPU under
/// load (see the README's performance section).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    svcgate::cli::run(svcgate::cli::Cli::parse())
}
