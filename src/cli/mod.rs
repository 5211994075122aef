//! The command line: one clap struct per subcommand, dispatched from [`run`].

mod client;
mod input;
mod live;
mod offline;
mod serve;
mod workload;

use std::path::{Path, PathBuf};
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
    /// Run the admission webhook (HTTPS) and its metrics endpoint.
    Serve(serve::ServeArgs),
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
    /// Offline (`-f POD.yaml --policies PATH`): given nodes, it also says which of
    /// them each pod may land on, with berth's pool labels and taints applied as the
    /// controller keeps them. A workload in the file stands for the pod its template
    /// makes. Live (`pod NAME -n NS`): the same for a pod in the cluster, with its
    /// namespace, the policies and the nodes read from there, and where the pod
    /// stands now (bound, held by berth and behind which pod, or what the scheduler
    /// says). Live for a workload (`deployment NAME -n NS`, and statefulset,
    /// daemonset, job, cronjob, replicaset): the pod its template makes, then where
    /// each of its pods is now.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Explain {
        #[command(subcommand)]
        live: Option<Live>,
        #[command(flatten)]
        files: Option<PlacementFiles>,
    },
    /// Make a CA and a serving certificate for the webhook, and the caBundle.
    ///
    /// Writes ca.crt, ca.key, tls.crt, tls.key and caBundle into --out, and
    /// apiserver-client.crt and .key: a client certificate for the apiserver to
    /// present where berth runs with --client-ca ca.crt. A CA already there is
    /// reused, so running it again renews only the certificates it signs.
    Certs {
        /// The webhook's Service name.
        #[arg(long, default_value = "berth")]
        service: String,
        /// The webhook's namespace.
        #[arg(long, default_value = "berth-system")]
        namespace: String,
        /// Where to write the files.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Validity of the serving certificate, in days.
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
    /// Print the PlacementPolicy CustomResourceDefinition, generated from the Rust types.
    Crd,
    /// Print the webhook configurations (manifests/webhooks.yaml), generated from
    /// the namespaces berth never sees.
    Webhooks,
    /// Print the ValidatingAdmissionPolicies that keep berth's structural rules with
    /// berth down (manifests/admission-policy.yaml), generated from berth's rules.
    AdmissionPolicy {
        /// berth's identity, which alone may release its gates: the username of the
        /// ServiceAccount berth runs as.
        #[arg(long, default_value = crate::names::BERTH_SERVICE_ACCOUNT)]
        berth_user: String,
        /// Print instead the MutatingAdmissionPolicy berth-placement and its
        /// binding, which place pods with berth down
        /// (manifests/placement-policy.yaml).
        #[arg(long)]
        placement: bool,
    },
}

/// What `berth explain` reads from the cluster.
#[derive(Debug, Subcommand)]
enum Live {
    /// Explain a pod in the cluster, through the kubeconfig.
    #[command(alias = "po")]
    Pod(live::Target),
    /// Explain the pod a Deployment's template makes, and where its pods are now.
    #[command(alias = "deploy")]
    Deployment(live::Target),
    /// Explain the pod a ReplicaSet's template makes, and where its pods are now.
    #[command(alias = "rs")]
    Replicaset(live::Target),
    /// Explain the pod a StatefulSet's template makes, and where its pods are now.
    #[command(alias = "sts")]
    Statefulset(live::Target),
    /// Explain the pod a DaemonSet's template makes, and where its pods are now.
    #[command(alias = "ds")]
    Daemonset(live::Target),
    /// Explain the pod a Job's template makes, and where its pods are now.
    Job(live::Target),
    /// Explain the pod a CronJob's Jobs make, and where its pods are now.
    #[command(alias = "cj")]
    Cronjob(live::Target),
}

impl Live {
    fn target(&self) -> (Option<workload::Kind>, &live::Target) {
        use workload::Kind;
        match self {
            Live::Pod(t) => (None, t),
            Live::Deployment(t) => (Some(Kind::Deployment), t),
            Live::Replicaset(t) => (Some(Kind::ReplicaSet), t),
            Live::Statefulset(t) => (Some(Kind::StatefulSet), t),
            Live::Daemonset(t) => (Some(Kind::DaemonSet), t),
            Live::Job(t) => (Some(Kind::Job), t),
            Live::Cronjob(t) => (Some(Kind::CronJob), t),
        }
    }
}

/// The name berth answers to: installed as `kubectl-berth`, kubectl runs it as
/// the plugin `kubectl berth`, and its help and usage lines say so.
fn invoked_as(argv0: Option<&std::ffi::OsStr>) -> &'static str {
    let file = argv0
        .map(Path::new)
        .and_then(Path::file_stem)
        .and_then(|f| f.to_str());
    match file {
        Some("kubectl-berth") => "kubectl berth",
        _ => "berth",
    }
}

/// The command line, named after how berth was invoked.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let name = invoked_as(std::env::args_os().next().as_deref());
    let matches = Cli::command().bin_name(name).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Parses the command line and runs the chosen command; the exit code follows
/// SPEC: 0 success, 1 a denial, 2 bad input.
pub fn run() -> ExitCode {
    let Cli { command } = parse();
    let result = match command {
        Command::Serve(args) => return run_serve(args),
        Command::Certs {
            service,
            namespace,
            out,
            days,
        } => return run_certs(&service, &namespace, &out, days),
        Command::Mutate { files, output } => {
            offline::mutate(&files, output).map_err(|e| e.to_string())
        }
        Command::Explain {
            live: Some(live), ..
        } => {
            let (kind, target) = live.target();
            live::explain_live(kind, target)
        }
        Command::Explain {
            files: Some(files), ..
        } => offline::explain_offline(&files).map_err(|e| e.to_string()),
        Command::Explain { .. } => Err(
            "explain needs -f POD.yaml --policies PATH (offline), or pod NAME -n NS or \
             deployment|statefulset|daemonset|job|cronjob|replicaset NAME -n NS (live)"
                .into(),
        ),
        Command::Crd => {
            print!(
                "{}---\n{}",
                crate::policy::crd::crd_yaml(),
                crate::placement::static_placement::crd_yaml()
            );
            Ok(Ending::Done)
        }
        Command::Webhooks => {
            print!("{}", crate::admission::webhooks::manifests());
            Ok(Ending::Done)
        }
        Command::AdmissionPolicy {
            berth_user,
            placement,
        } => {
            if placement {
                print!("{}", crate::admission::static_cel::manifests(&berth_user));
            } else {
                print!("{}", crate::admission::cel::manifests(&berth_user));
            }
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

fn run_serve(args: serve::ServeArgs) -> ExitCode {
    crate::telemetry::init_logging();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.worker_threads {
        builder.worker_threads(threads.get());
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve::serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run_certs(service: &str, namespace: &str, out: &std::path::Path, days: i64) -> ExitCode {
    match crate::certs::write_certs(service, namespace, out, days) {
        Ok(issued) => {
            let ca = if issued.reused_ca {
                "reused the CA"
            } else {
                "made a new CA"
            };
            println!(
                "wrote {}: {ca}, a serving certificate for {service}.{namespace}.svc and 127.0.0.1, \
                 caBundle, and the apiserver's client certificate",
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
