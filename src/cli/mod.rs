//! The command line: one clap struct per subcommand, dispatched from [`run`].

use std::process::ExitCode;

use clap::Parser;

/// berth places pods on the right nodes with the unmodified default kube-scheduler.
///
/// It rewrites pods at admission with node affinity, tolerations and schedulerName
/// derived from PlacementPolicy objects and namespace annotations, and keeps labels
/// and taints on Nodes so the default scheduler enforces them.
#[derive(Debug, Parser)]
#[command(name = "berth", version, about, long_about)]
pub struct Cli {}

/// Parses the command line and runs the chosen command; the exit code follows
/// SPEC: 0 success, 1 a denial, 2 bad input.
pub fn run() -> ExitCode {
    let Cli {} = Cli::parse();
    ExitCode::SUCCESS
}
