//! `herd`: one command for a highly available PostgreSQL cluster on this machine.

mod admin;
mod agent_backup;
mod agent_dashboard;
mod agent_points;
mod agent_slots;
mod backup;
mod backup_hosts;
mod backup_list_hosts;
mod backup_schedule;
mod backup_setup;
mod bench;
mod bench_interrupt;
mod certs;
mod certs_rotate;
mod cli;
mod client_tls;
mod cluster_scrape;
mod commit_waits;
mod config_cmd;
mod coordinator_tasks;
mod copies_task;
mod copy;
mod copy_hosts;
mod copy_repair;
mod detach;
mod down;
mod group_add;
mod group_add_agents;
mod group_add_hosts;
mod group_admission;
mod host_restart;
mod host_status;
mod hosts;
mod hosts_admin;
mod hosts_restart;
mod hosts_status;
mod move_places;
mod move_requests;
mod output;
mod progress;
mod proxy_api;
mod proxy_group_add;
mod proxy_groups;
mod proxy_registry;
mod restore;
mod restore_groups;
mod restore_point;
mod restore_point_hosts;
mod secrets_cmd;
mod secrets_hosts;
mod shard_move;
mod shards;
mod status;
mod store_view;
mod up;
mod up_agents;
mod url;

use clap::Parser;

/// Raises the soft limit on open files to the hard limit: the endpoint holds one descriptor
/// per client connection, and the usual soft limit (1,024) would refuse clients long before
/// the pools or PostgreSQL are the limit.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                eprintln!("warning: cannot raise the open files limit from {soft} to {hard}: {e}");
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    raise_open_files_limit();
    // On 2 cores or fewer everything runs on one thread (tokio's current-thread scheduler):
    // the proxy's wake-ups then never cross threads, which measured 3-5 points better against
    // direct connections in `herd bench proxy` (docs/proxy-speed.md). Larger machines get 2
    // workers. HERD_WORKER_THREADS overrides (0 = one thread), for measurements.
    let small = std::thread::available_parallelism().map_or(true, |n| n.get() <= 2);
    let workers: usize = std::env::var("HERD_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if small { 0 } else { 2 });
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
        // `herd status` answered from the agents while the store was down: a degraded answer.
        Err(e) if e.is::<hosts_status::StoreUnreachable>() => {
            eprintln!("warning: {e}");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
