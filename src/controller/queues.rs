//! The queue PriorityClasses (SPEC "Groups"): for every policy with `queue` in
//! force, the controller keeps a class `berth-queue-<policy>-<value>` for each value
//! a pod of that policy may get, so the webhook only names classes that exist and
//! writes nothing on behalf of a review. The nodes loop works out the classes
//! wanted on its passes over everything ([`QueueClasses::keep`]) and hands those
//! not known to exist to the PriorityClass writer ([`super::wishes`]), which makes
//! them. The sweep ([`super::sweep`]) deletes the classes no policy allows once no
//! pod of a namespace that opts into the class's policy uses them.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Client;
use kube::api::{Api, PostParams};

use super::error::Error;
use super::wishes::{ClassWrites, Writer, locked};
use super::writes::{Kind, Writes};
use crate::names::{FIELD_MANAGER, owned_metadata, queue_class};
use crate::policy::PolicySet;

/// The class berth keeps for `value`: it orders the queue and never preempts.
pub fn class_object(class: &str, value: i32) -> PriorityClass {
    PriorityClass {
        metadata: owned_metadata(class),
        value: Some(value),
        preemption_policy: Some("Never".into()),
        global_default: Some(false),
        description: Some(
            "berth queue order: 3 x the pod's queue priority label (at most the policy's \
             maxPriority) + its QoS rank; never preempts"
                .into(),
        ),
    }
}

/// The classes the policies in force allow: name and value.
pub fn wanted(policies: &PolicySet) -> BTreeMap<String, i32> {
    policies
        .iter()
        .filter_map(|p| Some((p, p.spec.queue.as_ref()?)))
        .flat_map(|(policy, queue)| {
            queue
                .class_values()
                .map(|value| (queue_class(&policy.name, value), value))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The classes known to exist since the last resync (or change of leader): the
/// writer adds each it made or found, the nodes loop reads and forgets them.
#[derive(Debug, Default, Clone)]
pub struct QueueClasses {
    known: Arc<Mutex<BTreeSet<String>>>,
}

impl QueueClasses {
    /// Hands every class of `wanted` not known to exist to the writer.
    pub fn keep(&self, writes: &ClassWrites, wanted: &BTreeMap<String, i32>) {
        let mut known = locked(&self.known);
        // A class no policy allows any more is the sweep's; made again if wanted
        // again.
        known.retain(|c| wanted.contains_key(c));
        for (class, value) in wanted {
            if known.contains(class) {
                writes.settled(class);
            } else {
                writes.want(class.clone(), *value);
            }
        }
    }

    /// Forgets what is known: at a resync, so that a class deleted behind berth's
    /// back is made again.
    pub fn forget(&self) {
        locked(&self.known).clear();
    }

    fn knows(&self, class: &str) -> bool {
        locked(&self.known).contains(class)
    }
}

/// What the PriorityClass writer works with.
pub struct ClassWriter {
    pub writes: Writes,
    pub client: Client,
    /// Shared with the nodes loop: the writer notes each class it made or found.
    pub known: QueueClasses,
}

impl Writer for ClassWriter {
    type Key = String;
    type Wish = i32;

    /// A policy's classes come together (up to a few dozen), each a small create.
    const CONCURRENCY: usize = 4;

    const WHAT: &'static str = "make a queue PriorityClass";

    fn object(class: &String) -> String {
        class.clone()
    }

    fn write(
        &self,
        class: &String,
        value: i32,
    ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
        if self.known.knows(class) {
            return None;
        }
        let api: Api<PriorityClass> = Api::all(self.client.clone());
        let (writes, known, class) = (self.writes.clone(), self.known.clone(), class.clone());
        Some(async move {
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            let made = writes
                .make(
                    Kind::PriorityClass,
                    api.create(&params, &class_object(&class, value)),
                )
                .await;
            match made {
                Ok(_) => tracing::info!(%class, value, "made queue PriorityClass"),
                // There already: a class is never changed once made.
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(e),
            }
            locked(&known.known).insert(class);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::wishes;
    use crate::controller::writes::Rates;
    use crate::policy::test_policies;
    use crate::telemetry::Metrics;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    #[tokio::test(start_paused = true)]
    async fn the_writer_makes_each_class_not_known_and_hands_back_a_failed_one() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = tokio::sync::watch::channel(true);
        let metrics = Arc::new(Metrics::default());
        let known = QueueClasses::default();
        locked(&known.known).insert("berth-queue-old-1".into());
        let queue = Arc::new(ClassWrites::default());
        let writer = ClassWriter {
            writes: Writes::new(metrics.clone(), leader, Rates::all(100)),
            client,
            known: known.clone(),
        };
        let (retried, mut retries) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(wishes::run(
            writer,
            queue.clone(),
            move |class: &String, _| retried.send(class.clone()).unwrap(),
            shutdown.clone(),
        ));
        let wanted = BTreeMap::from([
            ("berth-queue-jobs-0".to_string(), 0),
            ("berth-queue-jobs-1".to_string(), 1),
            ("berth-queue-jobs-2".to_string(), 2),
        ]);
        // The pass hands over what is not known, and forgets what is not wanted.
        known.keep(&queue, &wanted);
        assert!(!known.knows("berth-queue-old-1"), "no policy allows it");
        let mut made = Vec::new();
        for _ in 0..3 {
            let (request, send) = apiserver.next_request().await.expect("a create");
            assert_eq!(request.method(), "POST");
            assert_eq!(
                request.uri().path(),
                "/apis/scheduling.k8s.io/v1/priorityclasses"
            );
            assert_eq!(request.uri().query(), Some("&fieldManager=berth"));
            let class = body(request).await;
            let name = class["metadata"]["name"].as_str().unwrap().to_owned();
            assert_eq!(class["preemptionPolicy"], "Never");
            assert_eq!(class["value"], json!(wanted[&name]), "{name} has its value");
            let code = match name.as_str() {
                "berth-queue-jobs-0" => 201,
                "berth-queue-jobs-1" => 409,
                _ => 500,
            };
            let answered = if code == 201 {
                json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": name}, "value": 0})
            } else {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code})
            };
            send.send_response(answer(code, answered));
            made.push(name);
        }
        made.sort();
        assert_eq!(made, wanted.keys().cloned().collect::<Vec<_>>());
        assert_eq!(
            retries.recv().await.unwrap(),
            "berth-queue-jobs-2",
            "the failed one is handed back"
        );
        assert!(known.knows("berth-queue-jobs-0"), "made");
        assert!(known.knows("berth-queue-jobs-1"), "there already");
        assert!(!known.knows("berth-queue-jobs-2"));
        // The next pass over everything asks only for the one not known.
        known.keep(&queue, &wanted);
        let (request, send) = apiserver.next_request().await.expect("a create");
        assert_eq!(
            body(request).await["metadata"]["name"],
            "berth-queue-jobs-2"
        );
        send.send_response(answer(
            201,
            json!({"apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass", "metadata": {"name": "berth-queue-jobs-2"}, "value": 2}),
        ));
        while !known.knows("berth-queue-jobs-2") {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        task.await.unwrap();
        let counted = |outcome: &str| {
            metrics
                .controller_writes
                .get_or_create(&crate::telemetry::WriteLabels {
                    kind: "priority_class".into(),
                    outcome: outcome.into(),
                })
                .get()
        };
        assert_eq!(
            (counted("ok"), counted("conflict"), counted("error")),
            (2, 1, 1),
            "each create counted"
        );
    }

    #[test]
    fn each_queue_policy_has_a_class_for_every_value_its_pods_may_get() {
        let set = test_policies(&[
            ("jobs", json!({"queue": {"maxPriority": 2}})),
            (
                "flat",
                json!({"queue": {"maxPriority": 1, "qosTieBreak": false}}),
            ),
            ("cdn", json!({"pool": {"nodeNames": ["node2"]}})),
        ]);
        let wanted = wanted(&set);
        assert_eq!(wanted.len(), 9 + 2);
        assert_eq!(wanted["berth-queue-jobs-8"], 8);
        assert_eq!(wanted["berth-queue-flat-3"], 3);
        assert!(!wanted.contains_key("berth-queue-flat-1"), "no QoS ranks");
    }
}
