//! `herd`: one command for a highly available PostgreSQL cluster on this machine.

mod admin;
mod bench;
mod cli;
mod config_cmd;
mod detach;
mod down;
mod output;
mod progress;
mod status;
mod up;
mod url;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    // HERD_WORKER_THREADS overrides the runtime's thread count (for measurements); 0 runs
    // everything on the main thread (tokio's current-thread scheduler).
    let workers: usize = std::env::var("HERD_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mut builder = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
