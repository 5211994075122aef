//! The client of the cluster that `berth explain` and `berth serve` talk to.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// A client from `kubeconfig`, or without one from the in-cluster service account
/// (or the usual kubeconfig lookup).
pub(super) async fn kube_client(kubeconfig: Option<&Path>) -> Result<Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let file =
                Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Config::infer().await.map_err(|e| e.to_string())?,
    };
    Client::try_from(with_read_timeout(config)).map_err(|e| e.to_string())
}

/// Bounds the wait for every answer from the apiserver: a request on a connection
/// that went silent fails after this long instead of hanging forever (kube sets no
/// read timeout). Longer than a watch is kept open, so a quiet watch ends on the
/// apiserver's side first; counted from each write, not from when a pooled
/// connection went idle.
fn with_read_timeout(mut config: Config) -> Config {
    let watch = u64::from(crate::objects::WATCH_SECONDS);
    config.read_timeout = Some(std::time::Duration::from_secs(watch + 15));
    config.reset_reader_on_write = true;
    config
}
