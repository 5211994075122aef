//! helm, built from its Go module by `tests/cluster/build-helm`, run with its own
//! folders under target/ and never the user's configuration.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use super::{cluster_script, repo_root};

/// The chart, relative to the repository root (helm runs there).
pub const CHART: &str = "charts/berth";

/// The helm binary, built once by `tests/cluster/build-helm`.
pub fn helm_bin() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| PathBuf::from(cluster_script("build-helm", &[]).trim()))
}

/// helm's own folders (plugins, repositories, cache) under target/, never the
/// user's; and a KUBECONFIG that does not exist unless `kubeconfig` is given.
pub fn helm_command(kubeconfig: Option<&Path>) -> Command {
    let home = repo_root().join("target/test-helm");
    let mut command = Command::new(helm_bin());
    command
        .current_dir(repo_root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env(
            "KUBECONFIG",
            kubeconfig.map_or_else(|| home.join("no-cluster"), Path::to_path_buf),
        );
    command
}

/// Panics with `what` and the output unless the command succeeded; its stdout.
pub fn succeeded(what: &str, output: Output) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
