#![cfg(feature = "e2e")]
//! Queue order (seed 003's QueueSort) on the real control plane: pods of a `queue`
//! policy get a `berth-queue-<policy>-<value>` PriorityClass (made by berth's
//! controller), so the unmodified
//! kube-scheduler takes them by `groupPriority`, then QoS class, and none ever
//! preempts another.
//!
//! Its own test binary: the test stops kube-scheduler while it creates the pods, and
//! it installs a cluster-wide default PriorityClass.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::fixtures::{self, policy};
use support::{Berth, Nodes, eventually, opted_in};

const NODES: Nodes = Nodes {
    count: 1,
    prefix: "qnode",
};
const WAIT: Duration = Duration::from_secs(120);
/// The node takes this many pods.
const ROOM: usize = 4;

fn berth() -> &'static Berth {
    Berth::shared(NODES)
}

#[derive(Debug, Clone, Copy)]
enum Qos {
    BestEffort = 0,
    Burstable = 1,
    Guaranteed = 2,
}

/// A pod of the queue policy with `groupPriority` `priority` and QoS class `qos`.
fn queued(name: &str, priority: i32, qos: Qos) -> Pod {
    let resources = match qos {
        Qos::BestEffort => json!({}),
        Qos::Burstable => json!({"requests": {"cpu": "10m"}}),
        Qos::Guaranteed => json!({"requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "10m", "memory": "16Mi"}}),
    };
    fixtures::pod(name)
        .labels(json!({"app": "queue", "groupPriority": priority.to_string()}))
        .spec(json!({"containers": [{"name": "app", "image": "app:1", "resources": resources}]}))
        .build()
}

fn bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
}

/// The pod's PodScheduled condition reason, once the scheduler has found no room.
fn unschedulable(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| {
        c.iter()
            .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
    })
}

#[tokio::test]
async fn the_scheduler_takes_queued_pods_in_berths_order_and_never_preempts() {
    let cluster = berth().cluster;
    let client = cluster.client().await;
    let dir = cluster.dir.to_string_lossy().into_owned();
    // Room for four pods on the only node.
    cluster.kubectl_ok(&[
        "patch",
        "node",
        "qnode1",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        &json!({"status": {"allocatable": {"pods": ROOM.to_string()},
            "capacity": {"pods": ROOM.to_string()}}})
        .to_string(),
    ]);
    // A global default would be given to every pod that names no class; berth's
    // queue class replaces it.
    cluster.apply(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: cluster-default}\nvalue: 100\nglobalDefault: true\n",
    );
    cluster.apply_policies(&[policy(
        "queue",
        json!({"podSelector": {"matchLabels": {"app": "queue"}}, "queue": {}}),
    )]);
    let probe = json!({"app": "queue", "groupPriority": "1"});
    let ns = opted_in(&client, "queue", "queue", probe.clone(), WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // The controller makes the policy's classes; a pod admitted before the
    // apiserver knows them is left unqueued.
    let probe = support::test_pod("probe", probe, json!({}));
    support::wait_admitted(
        &client,
        &ns,
        &probe,
        "the controller made the queue's classes",
        |p| {
            let class = p
                .spec
                .as_ref()
                .and_then(|s| s.priority_class_name.as_deref());
            class.is_some_and(|c| c.starts_with(&format!("{}queue-", names::QUEUE_CLASS_PREFIX)))
        },
        WAIT,
    )
    .await;

    // Created while nothing schedules, in an order unlike the queue's.
    let queue = [
        ("low-guaranteed", 0, Qos::Guaranteed),
        ("mid-besteffort", 1, Qos::BestEffort),
        ("high-besteffort", 2, Qos::BestEffort),
        ("low-besteffort", 0, Qos::BestEffort),
        ("mid-guaranteed", 1, Qos::Guaranteed),
        ("low-burstable", 0, Qos::Burstable),
        ("high-guaranteed", 2, Qos::Guaranteed),
        ("mid-burstable", 1, Qos::Burstable),
    ];
    support::cluster_script("component", &[&dir, "stop", "kube-scheduler"]);
    for (name, priority, qos) in queue {
        let created = pods
            .create(&PostParams::default(), &queued(name, priority, qos))
            .await
            .unwrap_or_else(|e| panic!("{name} admitted: {e}"));
        // The three fields together, as the apiserver's Priority plugin accepts.
        let value = 3 * priority + qos as i32;
        let spec = created.spec.expect("spec");
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some(names::queue_class("queue", value).as_str()),
            "{name}"
        );
        assert_eq!(spec.priority, Some(value), "{name}");
        assert_eq!(spec.preemption_policy.as_deref(), Some("Never"), "{name}");
    }
    support::cluster_script("component", &[&dir, "start", "kube-scheduler"]);

    // The scheduler binds four; the other four it finds no room for.
    let all = eventually("4 bound, 4 unschedulable", WAIT, || async {
        let all = pods.list(&ListParams::default()).await.ok()?.items;
        let (b, u) = (
            all.iter().filter(|p| bound(p)).count(),
            all.iter().filter(|p| unschedulable(p)).count(),
        );
        (b == ROOM && u == queue.len() - ROOM).then_some(all)
    })
    .await;
    let got: BTreeSet<String> = all
        .iter()
        .filter(|p| bound(p))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    // Higher groupPriority first; among equals Guaranteed > Burstable > BestEffort.
    let mut order = queue.to_vec();
    order.sort_by_key(|(_, priority, qos)| std::cmp::Reverse((*priority, *qos as i32)));
    let want: BTreeSet<String> = order[..ROOM].iter().map(|(n, ..)| n.to_string()).collect();
    assert_eq!(got, want);

    // An urgent pod on the full node waits: berth's classes never preempt. The
    // scheduler has decided when it marks the pod unschedulable; preemption would
    // have nominated the node first.
    pods.create(
        &PostParams::default(),
        &queued("urgent", 1000, Qos::Guaranteed),
    )
    .await
    .expect("urgent admitted");
    let urgent = eventually("urgent unschedulable", WAIT, || async {
        let p = pods.get("urgent").await.ok()?;
        unschedulable(&p).then_some(p)
    })
    .await;
    let nominated = urgent.status.and_then(|s| s.nominated_node_name);
    assert_eq!(nominated, None, "berth's class must not preempt");
    for name in &want {
        let p = pods.get(name).await.expect("still there");
        assert!(p.metadata.deletion_timestamp.is_none(), "{name} preempted");
    }

    // The control: a pod that names its own PriorityClass keeps it, and that class
    // may preempt; so the node above was full, and preemption was possible.
    cluster.apply(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: preempting}\nvalue: 1000000000\n",
    );
    let own = fixtures::pod("own-class")
        .container("app", "app:1")
        .labels(json!({"app": "queue", "groupPriority": "0"}))
        .spec(json!({"priorityClassName": "preempting"}))
        .build();
    // The apiserver's Priority plugin knows a new class only once its informer
    // has it: retry until then.
    let created = eventually("own-class admitted", WAIT, || async {
        pods.create(&PostParams::default(), &own).await.ok()
    })
    .await;
    let preemptor = created.metadata.uid.clone().expect("uid");
    let spec = created.spec.expect("spec");
    assert_eq!(spec.priority_class_name.as_deref(), Some("preempting"));
    assert_eq!(spec.priority, Some(1_000_000_000));
    // The scheduler's own record: a Preempted Event on each pod it preempts, whose
    // note names the pod it made room for by uid.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let preempted = eventually("the scheduler's Preempted Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=Preempted"))
            .await
            .ok()?;
        let seen: Vec<(String, String)> = list
            .items
            .into_iter()
            .map(|e| {
                let victim = e.regarding.and_then(|r| r.name).unwrap_or_default();
                (victim, e.note.unwrap_or_default())
            })
            .collect();
        (!seen.is_empty()).then_some(seen)
    })
    .await;
    // One victim, made room for own-class: none ever for a pod of berth's classes,
    // the urgent one included.
    let [(victim, note)] = &preempted[..] else {
        panic!("one pod preempted, for own-class: {preempted:?}");
    };
    assert!(
        note.contains(&preemptor) && note.ends_with("on node qnode1"),
        "{victim} preempted for another pod than own-class ({preemptor}): {note}"
    );
    assert!(
        want.contains(victim),
        "{victim} was not bound: {preempted:?}"
    );
    // The scheduler ranks the bound pods by berth's classes too: it keeps the
    // three first in the queue and preempts the fourth.
    assert_eq!(victim, order[ROOM - 1].0, "{preempted:?}");
    let gone = pods.get_opt(victim).await.expect("read the victim");
    assert!(
        gone.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "{victim} preempted but not deleted"
    );
}
