//! Why the cluster model could not learn what it asked the apiserver. None of
//! these stops the model: a watch backs off and lists again, a failed lookup
//! leaves what was known (see each caller).

use std::time::Duration;

use kube::runtime::reflector::store::WriterDropped;

/// What went wrong reading the cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A watch ended before its first full list: the model will never be whole,
    /// and nothing may act on it.
    #[error("a watch stopped before its first list")]
    WatchStopped(#[from] WriterDropped),
    /// The apiserver did not answer a lookup in time.
    #[error("the apiserver did not answer within {0:?}")]
    Timeout(Duration),
    /// The apiserver refused a lookup (its status and message), or could not be
    /// reached.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_say_what_went_wrong() {
        assert_eq!(
            Error::Timeout(Duration::from_secs(1)).to_string(),
            "the apiserver did not answer within 1s"
        );
        let (store, writer) = kube::runtime::reflector::store::<crate::objects::NodeObject>();
        drop(writer);
        let stopped = Error::from(store.wait_until_ready().await.unwrap_err());
        assert_eq!(stopped.to_string(), "a watch stopped before its first list");
    }
}
