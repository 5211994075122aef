#![cfg(feature = "e2e")]
//! Exclusion across a leader change: the state of the held pods lives in the
//! cluster (gates, bindings), so a new leader rebuilds it from there. It must not
//! release a pod beside one the old leader left in flight, and it must release the
//! rest once that one is bound. Its own cluster: the test kills berth's leader.
//! The new leader runs as the ServiceAccount of `manifests/rbac.yaml`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth::names;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent, watcher};
use serde_json::json;
use support::fixtures::policy;
use support::{
    Berth, Nodes, Replica, create_at_once, eventually, lease_holder, opted_in, placed, test_pod,
};

const NODES: Nodes = Nodes {
    count: 8,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);

async fn label_eligible(client: &Client, nodes: &[&str]) {
    let api: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {"zone": "failover"}}});
    for node in nodes {
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

/// (bound, released but unbound, still gated) among some pods.
type Census = (usize, usize, usize);

/// The census of the pods in `ns`.
async fn census(client: &Client, ns: &str) -> Census {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = api.list(&ListParams::default()).await.unwrap().items;
    count(pods.iter())
}

/// The census of `pods`.
fn count<'a>(pods: impl Iterator<Item = &'a Pod> + Clone) -> Census {
    let gated = |p: &&Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty())
    };
    let bound = |p: &&Pod| p.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    (
        pods.clone().filter(bound).count(),
        pods.clone().filter(|p| !bound(p) && !gated(p)).count(),
        pods.filter(gated).count(),
    )
}

/// The census of `ns` after each change to its pods, in the order of the
/// cluster's own history (a watch), each with the pod that changed.
struct History {
    states: Arc<Mutex<Vec<(String, Census)>>>,
    /// Lists of the pods: the first, then one after each gap in the watch.
    lists: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl History {
    /// Starts watching `ns` and returns once the watch has listed it.
    async fn start(client: &Client, ns: &str) -> History {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let states = Arc::new(Mutex::new(Vec::new()));
        let lists = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (states, lists) = (states.clone(), lists.clone());
            async move {
                let mut events = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                let mut live: BTreeMap<String, Pod> = BTreeMap::new();
                let mut listed = BTreeMap::new();
                while let Some(event) = events.next().await {
                    let changed = match event {
                        Ok(WatchEvent::Apply(pod)) => {
                            let name = pod.metadata.name.clone().unwrap_or_default();
                            live.insert(name.clone(), pod);
                            name
                        }
                        Ok(WatchEvent::Delete(pod)) => {
                            let name = pod.metadata.name.clone().unwrap_or_default();
                            live.remove(&name);
                            format!("{name} deleted")
                        }
                        Ok(WatchEvent::Init) => {
                            listed.clear();
                            continue;
                        }
                        Ok(WatchEvent::InitApply(pod)) => {
                            listed.insert(pod.metadata.name.clone().unwrap_or_default(), pod);
                            continue;
                        }
                        Ok(WatchEvent::InitDone) => {
                            live = std::mem::take(&mut listed);
                            lists.fetch_add(1, Ordering::AcqRel);
                            "(listed)".to_owned()
                        }
                        Err(_) => continue,
                    };
                    let state = count(live.values());
                    states.lock().unwrap().push((changed, state));
                }
            }
        });
        let history = History {
            states,
            lists,
            task,
        };
        eventually("the watch on the pods", WAIT, || async {
            (history.lists.load(Ordering::Acquire) > 0).then_some(())
        })
        .await;
        history
    }

    /// Every census so far, once the watch has seen `last`.
    async fn until(&self, last: Census) -> Vec<(String, Census)> {
        eventually(&format!("the watch sees {last:?}"), WAIT, || async {
            let states = self.states.lock().unwrap().clone();
            (states.last().map(|(_, s)| *s) == Some(last)).then_some(states)
        })
        .await
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_new_leader_keeps_the_old_leaders_pod_in_flight_and_releases_the_rest() {
    let berth = Berth::shared(NODES);
    let client = berth.cluster.client().await;
    // Three eligible nodes for six pods: the old leader binds three, leaves the
    // fourth in flight (released, unschedulable; see below) and two held.
    label_eligible(&client, &["node1", "node2", "node3"]).await;
    berth.cluster.apply_policies(&[policy(
        "failover",
        json!({"podSelector": {"matchLabels": {"app": "failover"}},
            "avoid": {"matchLabels": {"app": "failover"}},
            "nodeAffinity": {"required": [{"key": "zone", "operator": "In", "values": ["failover"]}]}}),
    )]);
    let ns = opted_in(
        &client,
        "failover",
        "failover",
        json!({"app": "failover"}),
        WAIT,
    )
    .await;
    let leader = eventually("a leader", WAIT, || lease_holder(&client)).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "berth-system");
    let transitions = |lease: Lease| lease.spec.and_then(|s| s.lease_transitions);
    // The standby has only what the shipped RBAC grants, so the take-over below
    // also shows that an installation may hold the Lease, release pods and label
    // nodes.
    let account = berth.cluster.berth_service_account_kubeconfig();
    let standby = Replica::start(berth, "standby", &account);

    // A host port hides from berth where a pod fits: each goes alone, and the
    // fourth, narrowed off the three nodes taken, stays in flight, unschedulable.
    // (A pod whose fit berth predicts would wait held instead.)
    let host_port = json!({"containers": [{"name": "redis", "image": "redis:7",
        "ports": [{"containerPort": 6379, "hostPort": 6379}],
        "resources": {"requests": {"cpu": "100m"}}}]});
    let pods = (0..6)
        .map(|i| {
            let name = format!("cache-{i}");
            test_pod(&name, json!({"app": "failover"}), host_port.clone())
        })
        .collect();
    // The whole history of the pods, from before the first is created.
    let history = History::start(&client, &ns).await;
    create_at_once(&client, &ns, pods).await;
    eventually("three bound, one in flight, two held", WAIT, || async {
        (census(&client, &ns).await == (3, 1, 2)).then_some(())
    })
    .await;
    // The leader's metrics (no other test shares this berth): four released and
    // timed, two held now.
    eventually("the leader's gate metrics", WAIT, || async {
        let held = berth.metric(&format!(
            r#"berth_gated_pods{{gate="{}"}}"#,
            names::AVOID_GATE
        ));
        let timed = berth.metric(&format!(
            r#"berth_gated_seconds_count{{gate="{}"}}"#,
            names::AVOID_GATE
        ));
        (held == Some(2.0) && timed == Some(4.0)).then_some(())
    })
    .await;

    let held_since = transitions(leases.get("berth-controller").await.unwrap());
    // A leader that is killed cannot hand over: the standby takes the Lease when
    // it expires, with nothing but what it reads from the cluster.
    let killed = Command::new("kill")
        .args(["-KILL", &berth.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    eventually("the standby leads", WAIT, || async {
        (lease_holder(&client).await.as_deref() == Some("standby")).then_some(())
    })
    .await;
    // The Lease's own record of the take-over: one transition, from the leader
    // killed above to the standby (no other replica held it between).
    let after = leases.get("berth-controller").await.unwrap();
    assert_eq!(
        transitions(after),
        Some(held_since.unwrap_or(0) + 1),
        "the standby took the Lease over from {leader}"
    );
    // The new leader's own Events say it has looked at both held pods and holds
    // them behind the pod in flight; it released nothing.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("the new leader's word on both held pods", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=HeldForExclusion"))
            .await
            .ok()?;
        let held: BTreeSet<String> = list
            .items
            .into_iter()
            .filter(|e| e.reporting_instance.as_deref() == Some("standby"))
            .filter_map(|e| e.regarding?.name)
            .collect();
        (held.len() == 2).then_some(())
    })
    .await;

    // Room for everyone: the pod in flight lands, then the held ones, one by one.
    label_eligible(&client, &["node4", "node5", "node6"]).await;
    let nodes = placed(&client, &ns, "app=failover", 6, WAIT).await;
    let distinct: BTreeSet<&String> = nodes.values().collect();
    assert_eq!(distinct.len(), 6, "two pods share a node: {nodes:?}");
    // The new leader also keeps the anchor label on every node with a pod.
    let api: Api<Node> = Api::all(client.clone());
    for node in distinct {
        eventually(&format!("the anchor label on {node}"), WAIT, || async {
            let labels = api.get(node).await.ok()?.metadata.labels?;
            labels
                .contains_key(&names::anchor_label("failover"))
                .then_some(())
        })
        .await;
    }
    // The cluster's history of the pods, in order: no pod was ever released
    // beside another in flight, by either leader; so the new leader released
    // nothing while the old leader's pod was in flight, and the rest one by one
    // once it was bound.
    let states = history.until((6, 0, 0)).await;
    let beside = states.iter().find(|(_, (_, in_flight, _))| *in_flight > 1);
    assert!(
        beside.is_none(),
        "a pod released beside another in flight: {beside:?} in {states:?}"
    );
    assert_eq!(
        history.lists.load(Ordering::Acquire),
        1,
        "the watch had a gap: {states:?}"
    );
    let log = std::fs::read_to_string(berth.cluster.dir.join("logs/standby.log")).unwrap();
    assert!(
        !log.contains("forbidden"),
        "the shipped RBAC falls short:\n{log}"
    );
    drop(standby);
}
