//! The command line: one clap struct per subcommand, dispatched from [`run`].

mod input;
mod offline;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use offline::{Ending, Output, PlacementFiles};

/// berth places pods on the right nodes with the unmodified default kube-scheduler.
///
/// It rewrites pods at admission with node affinity, tolerations and schedulerName
/// derived from PlacementPolicy objects and namespace annotations, and keeps labels
/// and taints on Nodes so the default scheduler enforces them.
///
/// Exit codes: 0 success, 1 a pod was denied, 2 bad input.
#[derive(Debug, Parser)]
#[command(name = "berth", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Mutate pods offline exactly as the webhook would, and print the result.
    ///
    /// Warnings go to stderr as `warning: ...`; a denied pod is not printed and
    /// `denied: <reason>` goes to stderr with exit code 1.
    Mutate {
        #[command(flatten)]
        files: PlacementFiles,
        /// What to print.
        #[arg(short, long, value_enum, default_value_t = Output::Yaml)]
        output: Output,
    },
    /// Explain in plain words which policies apply to pods, why, and what changes.
    ///
    /// Given nodes, it also says which of them each pod may land on, with berth's
    /// pool labels and taints applied as the controller keeps them.
    Explain {
        #[command(flatten)]
        files: PlacementFiles,
        /// Nodes to check the pods against (YAML or JSON, several documents allowed).
        #[arg(long, value_name = "NODES.yaml")]
        nodes: Option<PathBuf>,
    },
    /// Print the PlacementPolicy CustomResourceDefinition, generated from the Rust types.
    Crd,
}

/// Parses the command line and runs the chosen command; the exit code follows
/// SPEC: 0 success, 1 a denial, 2 bad input.
pub fn run() -> ExitCode {
    let Cli { command } = Cli::parse();
    let result = match command {
        Command::Mutate { files, output } => offline::mutate(&files, output),
        Command::Explain { files, nodes } => offline::explain_offline(&files, nodes.as_deref()),
        Command::Crd => {
            print!("{}", crate::policy::crd::crd_yaml());
            Ok(Ending::Done)
        }
    };
    match result {
        Ok(Ending::Done) => ExitCode::SUCCESS,
        Ok(Ending::Denied) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
