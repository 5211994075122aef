//! The node writer: the one task that writes nodes' berth labels and taints.
//!
//! The nodes pass computes what each node should carry and hands it over
//! ([`NodeQueue::want`]); this task writes it, [`WRITE_CONCURRENCY`] nodes at a
//! time, through the door ([`super::writes`]) at `--node-qps`. So a pass never
//! waits for its writes: a pool over 5,000 nodes takes its writes seconds, and
//! meanwhile the policies' status, DaemonSet templates and the passes for other
//! nodes go on (a deleted policy's finalizer waits for its nodes, as it should).
//!
//! - The latest wish for a node wins: one asked for again before it is written is
//!   written once, as last asked.
//! - A node is never written twice at once: a wish for a node being written waits
//!   for that write to end.
//! - Each write is made against the node as the cache holds it then, and none is
//!   made when the node already carries what is wanted (or is gone).
//! - A node whose write failed is handed back to the nodes pass after
//!   [`RETRY_FAILED`], which computes it again from what holds then.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::context::{locked, until};
use super::writer::{in_sync, write_node};
use super::writes::{Error, RETRY_FAILED, Writes};
use crate::objects::NodeObject;
use crate::placement::desired::DesiredNode;
use crate::telemetry::{KindLabels, Metrics};

/// Node writes in flight at once. Enough for `--node-qps` when each write takes
/// the apiserver 100 ms or more: at 16, a pool over 5,000 nodes went at 170
/// writes a second (29 s) whatever the rate allowed; at 48, at the rate.
pub const WRITE_CONCURRENCY: usize = 48;

/// What the nodes pass wants written and the writer has not finished; shared by
/// the two.
#[derive(Debug, Default)]
pub struct NodeQueue {
    queue: Mutex<Queue>,
    /// Told of every wish, so the writer takes it.
    asked: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    /// Names in the order first asked. A name may be here whose wish was taken
    /// back, or twice: the wish in `wanted` is what counts. A node being written
    /// leaves it until its write ends.
    order: VecDeque<String>,
    /// The latest wish for each node not yet being written.
    wanted: HashMap<String, DesiredNode>,
    /// Nodes being written, and what they are being brought to.
    writing: HashMap<String, DesiredNode>,
}

impl NodeQueue {
    /// Asks for node `name` to be brought to `desired`, in place of anything
    /// asked for it before and not yet written.
    pub fn want(&self, name: &str, desired: DesiredNode) {
        let mut queue = locked(&self.queue);
        let queue = &mut *queue;
        if queue.wanted.insert(name.to_owned(), desired).is_none() {
            queue.order.push_back(name.to_owned());
        }
        self.asked.notify_one();
    }

    /// Takes back any wish for `name` not yet being written: the node carries
    /// what it should, or is gone.
    pub fn settled(&self, name: &str) {
        locked(&self.queue).wanted.remove(name);
    }

    /// Whether any write being made brings its node to a state that `test`
    /// holds for. A wish not yet taken is left out: the pass that asks replaces
    /// it.
    pub fn writing_any(&self, test: impl Fn(&DesiredNode) -> bool) -> bool {
        locked(&self.queue).writing.values().any(test)
    }

    /// Forgets every wish not yet being written (this replica lost the Lease, or
    /// stopped leading for good).
    pub fn clear(&self) {
        let mut queue = locked(&self.queue);
        queue.order.clear();
        queue.wanted.clear();
    }

    /// The next node to write and what to write, marked as being written.
    fn next(&self) -> Option<(String, DesiredNode)> {
        let mut queue = locked(&self.queue);
        let queue = &mut *queue;
        while let Some(name) = queue.order.pop_front() {
            // A node being written comes back when its write ends.
            if queue.writing.contains_key(&name) {
                continue;
            }
            if let Some(desired) = queue.wanted.remove(&name) {
                queue.writing.insert(name.clone(), desired.clone());
                return Some((name, desired));
            }
        }
        None
    }

    /// The write to `name` ended; a wish that waited for it goes first.
    fn written(&self, name: &str) {
        let mut queue = locked(&self.queue);
        queue.writing.remove(name);
        if queue.wanted.contains_key(name) {
            queue.order.push_front(name.to_owned());
            self.asked.notify_one();
        }
    }
}

/// What the node writer works with.
pub struct NodeWriter {
    pub queue: Arc<NodeQueue>,
    pub writes: Writes,
    pub client: Client,
    /// The cluster room's nodes: each write starts from the node as held there.
    pub nodes: Store<NodeObject>,
    pub metrics: Arc<Metrics>,
}

impl NodeWriter {
    /// Writes what the queue asks until `shutdown`; hands each node whose write
    /// failed to `retry` after [`RETRY_FAILED`].
    pub async fn run(self, retry: impl Fn(&str), shutdown: CancellationToken) {
        let mut in_flight = FuturesUnordered::new();
        let mut failed: Vec<String> = Vec::new();
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            while in_flight.len() < WRITE_CONCURRENCY
                && let Some((name, desired)) = self.queue.next()
            {
                match self.nodes.get(&ObjectRef::new(&name)) {
                    Some(node) if !in_sync(&node, &desired) => {
                        let (writes, client) = (self.writes.clone(), self.client.clone());
                        in_flight.push(async move {
                            let result = write_node(&writes, &client, &node, &desired).await;
                            (name, result)
                        });
                    }
                    _ => self.queue.written(&name),
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some((name, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    self.queue.written(&name);
                    if self.count(&name, result) {
                        failed.push(name);
                        retry_at.get_or_insert_with(|| tokio::time::Instant::now() + RETRY_FAILED);
                    }
                }
                // With every write slot taken, a wish waits for a write to end.
                () = self.queue.asked.notified(), if in_flight.len() < WRITE_CONCURRENCY => {}
                () = until(retry_at) => {
                    retry_at = None;
                    for name in failed.drain(..) {
                        retry(&name);
                    }
                }
            }
        }
    }

    /// Counts a write's outcome; true when it failed and is worth a retry.
    fn count(&self, node: &str, result: Result<super::writer::Written, Error>) -> bool {
        match result {
            Ok(written) => {
                for (kind, did) in [("labels", written.labels), ("taints", written.taints)] {
                    if did {
                        self.metrics
                            .node_writes
                            .get_or_create(&KindLabels { kind: kind.into() })
                            .inc();
                    }
                }
                self.metrics
                    .write_conflicts
                    .inc_by(written.conflicts as u64);
                false
            }
            // Not a failure: a new leader computes every node again.
            Err(Error::NotLeader) => false,
            Err(e) => {
                tracing::warn!(%node, error = %e, "node write failed; retrying in {RETRY_FAILED:?}");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::writes::Rates;
    use crate::names::POOL_LABEL;
    use kube::runtime::watcher::Event;
    use serde_json::json;
    use std::time::Duration;

    fn wish(pool: &str) -> DesiredNode {
        DesiredNode {
            labels: [(POOL_LABEL.to_string(), pool.to_string())].into(),
            ..DesiredNode::default()
        }
    }

    fn pool_of(desired: &DesiredNode) -> &str {
        &desired.labels[POOL_LABEL]
    }

    #[test]
    fn the_latest_wish_is_written_and_a_node_is_never_written_twice_at_once() {
        let queue = NodeQueue::default();
        queue.want("a", wish("one"));
        queue.want("b", wish("b"));
        queue.want("a", wish("two"));
        let (name, desired) = queue.next().unwrap();
        assert_eq!(
            (name.as_str(), pool_of(&desired)),
            ("a", "two"),
            "once, as last asked"
        );
        queue.want("a", wish("three"));
        let (name, _) = queue.next().unwrap();
        assert_eq!(name, "b", "a's new wish waits for its write in flight");
        assert!(queue.next().is_none());
        assert!(queue.writing_any(|d| pool_of(d) == "two"));
        assert!(!queue.writing_any(|d| pool_of(d) == "three"), "not taken");
        queue.written("a");
        let (name, desired) = queue.next().unwrap();
        assert_eq!((name.as_str(), pool_of(&desired)), ("a", "three"));
        queue.written("a");
        queue.written("b");
        assert!(!queue.writing_any(|_| true));
        assert!(queue.next().is_none());
    }

    #[test]
    fn a_wish_taken_back_is_not_written() {
        let queue = NodeQueue::default();
        queue.want("a", wish("one"));
        queue.want("b", wish("one"));
        queue.settled("a");
        let (name, _) = queue.next().unwrap();
        assert_eq!(name, "b");
        assert!(queue.next().is_none(), "a was taken back");
        // Taken back while it waits for its node's write to end: nothing follows
        // the write.
        queue.want("b", wish("two"));
        assert!(queue.next().is_none(), "b's wish waits");
        queue.settled("b");
        queue.written("b");
        assert!(queue.next().is_none());
        // A replica that lost the Lease forgets what is asked, not what is being
        // written: no second write of c starts before the first ends.
        queue.want("c", wish("one"));
        queue.next().unwrap();
        queue.want("d", wish("one"));
        queue.clear();
        assert!(queue.next().is_none());
        assert!(queue.writing_any(|_| true), "c's write is still on its way");
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
            queue: queue.clone(),
            writes: Writes::new(Arc::default(), leader, Rates::all(100)),
            client,
            nodes,
            metrics: Arc::default(),
        };
        let (retried, mut retries) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(writer.run(
            move |node| retried.send(node.to_owned()).unwrap(),
            shutdown.clone(),
        ));
        queue.want("a", wish("p"));
        queue.want("b", wish("p"));
        queue.want("c", wish("p"));
        queue.want("gone", wish("p"));
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
                queue.want("a", wish("r"));
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
        assert!(failed_at.unwrap().elapsed() >= RETRY_FAILED);
        // Asked while the writer waits for work: it wakes for it.
        queue.want("b", wish("q"));
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
