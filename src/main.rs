//! The `svcgate` binary: parses the command line and hands over to the library.

use clap::Parser;
use std::process::ExitCode;

/// mimalloc rather than the system allocator: the request path allocates small, short-lived
/// buffers on every request, and glibc's malloc cost about a tenth of the gateway's CPU under
/// load (see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    no_huge_pages();
    svcgate::cli::run(svcgate::cli::Cli::parse())
}

/// Turns transparent huge pages off for this process, first thing, before the allocator has
/// touched more than a few pages (on Linux; elsewhere, and where it fails, nothing changes).
///
/// mimalloc's regions are aligned to 2 MiB, and where the kernel backs them with huge pages a
/// few live objects keep 2 MiB resident: with 100,000 keys cached, a fifth more resident
/// memory for a working set too small to gain from fewer TLB misses. This is
/// `MIMALLOC_ALLOW_THP=0`, which mimalloc reads only from the environment.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}
