//! The node writer: the one task that writes nodes' berth labels and taints.
//!
//! The nodes pass computes what each node should carry and hands it over
//! ([`Wishes::want`](super::wishes::Wishes::want)); this task writes it, [`NodeWriter::CONCURRENCY`] nodes at a
//! time, through [`super::writes`] at `--node-qps`, as every writer
//! task does ([`super::wishes`]). So a pass never waits for its writes: a pool over
//! 5,000 nodes takes its writes seconds, and meanwhile the policies' status,
//! DaemonSet templates and the passes for other nodes go on (a deleted policy's
//! finalizer waits for its nodes, as it should). A node whose write failed is
//! handed back to the nodes pass, which computes it again.

use std::future::Future;
use std::sync::Arc;

use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};

use super::error::Error;
use super::wishes::Writer;
use super::writer::{Written, in_sync, write_node};
use super::writes::Writes;
use crate::objects::NodeObject;
use crate::placement::desired::DesiredNode;
use crate::telemetry::{KindLabels, Metrics};

/// What the node writer works with.
pub struct NodeWriter {
    pub writes: Writes,
    pub client: Client,
    /// The cluster model's nodes: each write starts from the node as held there.
    pub nodes: Store<NodeObject>,
    pub metrics: Arc<Metrics>,
}

impl Writer for NodeWriter {
    type Key = String;
    type Wish = DesiredNode;

    /// Enough for `--node-qps` when each write takes the apiserver 100 ms or
    /// more: at 16, a pool over 5,000 nodes went at 170 writes a second (29 s)
    /// whatever the rate allowed; at 48, at the rate.
    const CONCURRENCY: usize = 48;

    const WHAT: &'static str = "write the node's berth labels and taints";

    fn object(name: &String) -> String {
        name.clone()
    }

    fn write(
        &self,
        name: &String,
        desired: DesiredNode,
    ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
        let node = self
            .nodes
            .get(&ObjectRef::new(name))
            .filter(|node| !in_sync(node, &desired))?;
        let (writes, client) = (self.writes.clone(), self.client.clone());
        let metrics = self.metrics.clone();
        Some(async move {
            let written = write_node(&writes, &client, &node, &desired).await?;
            count(&metrics, written);
            Ok(())
        })
    }
}

/// Counts what a node write did.
fn count(metrics: &Metrics, written: Written) {
    for (kind, did) in [("labels", written.labels), ("taints", written.taints)] {
        if did {
            metrics
                .node_writes
                .get_or_create(&KindLabels { kind: kind.into() })
                .inc();
        }
    }
    metrics.write_conflicts.inc_by(written.conflicts as u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::wishes::NodeQueue;
    use crate::controller::writes::Rates;
    use crate::names::POOL_LABEL;
    use kube::runtime::watcher::Event;
    use serde_json::json;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    fn wish(pool: &str) -> DesiredNode {
        DesiredNode {
            labels: [(POOL_LABEL.to_string(), pool.to_string())].into(),
            ..DesiredNode::default()
        }
    }

    fn node(name: &str, pool: Option<&str>) -> NodeObject {
        let labels = pool.map_or(json!({}), |p| json!({POOL_LABEL: p}));
        serde_json::from_value(json!({"metadata": {"name": name, "resourceVersion": "1",
            "labels": labels}}))
        .unwrap()
    }

    /// The next request, a node write: the node's name and the pool it writes.
    async fn next_write(
        apiserver: &mut tower_test::mock::Handle<
            hyper::Request<kube::client::Body>,
            hyper::Response<kube::client::Body>,
        >,
    ) -> (
        String,
        String,
        tower_test::mock::SendResponse<hyper::Response<kube::client::Body>>,
    ) {
        let (request, send) = apiserver.next_request().await.expect("a write");
        assert_eq!(request.method(), "PATCH");
        let node = request.uri().path().rsplit('/').next().unwrap().to_owned();
        let pool = body(request).await["metadata"]["labels"][POOL_LABEL]
            .as_str()
            .unwrap()
            .to_owned();
        (node, pool, send)
    }

    fn written(node: &str) -> hyper::Response<kube::client::Body> {
        answer(
            200,
            json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "resourceVersion": "2"}}),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn the_writer_writes_what_differs_and_hands_back_a_failed_node() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = tokio::sync::watch::channel(true);
        let (nodes, mut feed) = kube::runtime::reflector::store::<NodeObject>();
        for node in [node("a", None), node("b", Some("p")), node("c", None)] {
            feed.apply_watcher_event(&Event::Apply(node));
        }
        let queue = Arc::new(NodeQueue::default());
        let writer = NodeWriter {
            writes: Writes::new(Arc::default(), leader, Rates::all(100)),
            client,
            nodes,
            metrics: Arc::default(),
        };
        let (retried, mut retries) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(crate::controller::wishes::run(
            writer,
            queue.clone(),
            move |node: &String, _| retried.send(node.clone()).unwrap(),
            shutdown.clone(),
        ));
        queue.want("a".into(), wish("p"));
        queue.want("b".into(), wish("p"));
        queue.want("c".into(), wish("p"));
        queue.want("gone".into(), wish("p"));
        let mut firsts = Vec::new();
        let mut failed_at = None;
        for _ in 0..2 {
            let (node, pool, send) = next_write(&mut apiserver).await;
            assert_eq!(pool, "p");
            if node == "c" {
                send.send_response(answer(500, json!({"kind": "Status", "code": 500})));
                failed_at = Some(tokio::time::Instant::now());
            } else {
                // Asked again while its write is on its way: written after it.
                queue.want("a".into(), wish("r"));
                send.send_response(written(&node));
            }
            firsts.push(node);
        }
        firsts.sort();
        assert_eq!(firsts, ["a", "c"], "b carries its pool, gone is gone");
        let (node, pool, send) = next_write(&mut apiserver).await;
        assert_eq!((node.as_str(), pool.as_str()), ("a", "r"));
        send.send_response(written("a"));

        assert_eq!(retries.recv().await.unwrap(), "c");
        assert!(failed_at.unwrap().elapsed() >= crate::controller::error::RETRY_FAILED);
        // Asked while the writer waits for work: it wakes for it.
        queue.want("b".into(), wish("q"));
        let (node, pool, send) = next_write(&mut apiserver).await;
        assert_eq!((node.as_str(), pool.as_str()), ("b", "q"));
        send.send_response(written("b"));
        for _ in 0..100 {
            if !queue.writing_any(|_| true) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!queue.writing_any(|_| true), "every write ended");
        shutdown.cancel();
        task.await.unwrap();
        assert!(apiserver.next_request().await.is_none(), "no other write");
    }
}
