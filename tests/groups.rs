#![cfg(feature = "e2e")]
//! Groups (seeds 002, 003) on the real control plane, with kwok running the pods.
//!
//! - All-or-nothing in gate mode: the members of a gang are held by `berth.io/gang`
//!   until `minAvailable` of them exist and berth's fit check finds room for all;
//!   then every member goes at once. This cluster serves no PodGroup API, so berth
//!   holds and releases them itself (`podgroups.rs` runs the native mode).
//! - Ordered start: rank k is held by `berth.io/rank` until every pod of a lower
//!   rank is Ready and its Deployment has its replicas; the proof is in the
//!   cluster's own record, each pod's PodScheduled and Ready transition times.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use support::{Berth, Nodes, create_at_once, eventually, gang_member, opted_in};

const NODES: Nodes = Nodes {
    count: 6,
    prefix: "gnode",
};
const WAIT: Duration = Duration::from_secs(120);

fn berth() -> &'static Berth {
    Berth::shared(NODES)
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().map(|g| g.name.clone()).collect())
        .unwrap_or_default()
}

fn node(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

/// The messages of the Events with `reason` in `ns`, once there is one.
async fn events(ns: &str, reason: &str) -> String {
    eventually(&format!("a {reason} Event"), WAIT, || async {
        let out = berth().cluster.kubectl(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("reason={reason}"),
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (!text.is_empty()).then_some(text)
    })
    .await
}

/// Waits until a `reason` Event in `ns` says `text`.
async fn event_saying(ns: &str, reason: &str, text: &str) {
    eventually(
        &format!("a {reason} Event saying {text:?}"),
        WAIT,
        || async { events(ns, reason).await.contains(text).then_some(()) },
    )
    .await;
}

/// Waits until every pod in `ns` is bound; returns their nodes by name.
async fn all_bound(client: &Client, ns: &str, count: usize) -> Vec<(String, String)> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually("every member bound", WAIT, || async {
        let pods = api.list(&ListParams::default()).await.ok()?;
        let bound: Vec<(String, String)> = pods
            .items
            .iter()
            .filter_map(|p| Some((p.metadata.name.clone()?, node(p)?)))
            .collect();
        (bound.len() == count).then_some(bound)
    })
    .await
}

/// Every pod in `ns`: none is bound, each still held by the gang gate.
async fn none_bound(client: &Client, ns: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = api.list(&ListParams::default()).await.unwrap().items;
    for pod in &pods {
        assert_eq!(node(pod), None, "{:?} bound", pod.metadata.name);
        assert!(
            gates(pod).iter().any(|g| g == names::GANG_GATE),
            "{:?} released: {:?}",
            pod.metadata.name,
            gates(pod)
        );
    }
    pods
}

/// Asserts from the cluster's own record that no pod in `ns` was bound before
/// `last` was created: each one's PodScheduled became True (the binding sets it,
/// with nodeName) no earlier than `last`'s creationTimestamp. Both are the
/// apiserver's clock, in whole seconds, so a pod bound after `last` never reads
/// as earlier.
async fn held_until_created(client: &Client, ns: &str, last: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = api.list(&ListParams::default()).await.unwrap().items;
    let created = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(last))
        .and_then(|p| p.metadata.creation_timestamp.clone())
        .unwrap_or_else(|| panic!("{last} in {ns}"));
    for pod in &pods {
        let scheduled = became_true(pod, "PodScheduled").expect("bound");
        assert!(
            scheduled >= created,
            "{:?} bound at {:?}, before {last} was created at {:?}",
            pod.metadata.name,
            scheduled.0,
            created.0
        );
    }
}

#[tokio::test]
async fn a_gang_waits_for_its_last_member_then_goes_at_once() {
    let client = berth().cluster.client().await;
    berth()
        .cluster
        .apply_app_policy("gang-count", json!({"gang": {}}));
    let probe = json!({"app": "gang-count"});
    let ns = opted_in(&client, "gang-count", "gang-count", probe, WAIT).await;
    let pods = vec![
        gang_member("gang-count", "a", "g1", 3, "100m"),
        gang_member("gang-count", "b", "g1", 3, "100m"),
    ];
    create_at_once(&client, &ns, pods).await;
    // Created together, they may still reach the controller in two passes: the
    // first Event may count one member; one of them counts both.
    event_saying(&ns, "WaitingForGang", "gang g1 has 2 of its 3 members").await;
    // The controller looked at the group (its Event says so) and held both.
    assert_eq!(none_bound(&client, &ns).await.len(), 2);

    create_at_once(
        &client,
        &ns,
        vec![gang_member("gang-count", "c", "g1", 3, "100m")],
    )
    .await;
    all_bound(&client, &ns, 3).await;
    held_until_created(&client, &ns, "c").await;
}

#[tokio::test]
async fn a_gang_that_does_not_fit_stays_held_until_a_node_is_added() {
    let client = berth().cluster.client().await;
    // A dedicated pool of two nodes, 8 cpus each: room for two 5-cpu members
    // (the other tests' small pods may take a little of it before the taint).
    let pool =
        |nodes: &[&str]| json!({"gang": {"timeoutSeconds": 3}, "pool": {"nodeNames": nodes}});
    berth()
        .cluster
        .apply_app_policy("gang-fit", pool(&["gnode1", "gnode2"]));
    // The pods come once the pool is in place: what they do not fit is room.
    berth()
        .cluster
        .wait_for_pool("gang-fit", &["gnode1", "gnode2"], WAIT);
    let probe = json!({"app": "gang-fit"});
    let ns = opted_in(&client, "gang-fit", "gang-fit", probe, WAIT).await;
    let pods = ["a", "b", "c"]
        .iter()
        .map(|n| gang_member("gang-fit", n, "big", 3, "5"))
        .collect();
    create_at_once(&client, &ns, pods).await;
    let note = events(&ns, "GangDoesNotFit").await;
    assert!(note.contains("gang big (3 held) does not fit"), "{note}");
    assert!(note.contains("cpu"), "{note}");
    none_bound(&client, &ns).await;
    // Past timeoutSeconds: a Warning, the policy's condition, and still held.
    let note = events(&ns, "GangTimeout").await;
    assert!(note.contains("members stay held"), "{note}");
    let condition = eventually("the GangTimeout condition", WAIT, || async {
        let out = berth().cluster.kubectl(&[
            "get",
            "bpp",
            "gang-fit",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"GangTimeout\")].status} {.status.gangMode}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.starts_with("True").then_some(text)
    })
    .await;
    assert_eq!(
        condition, "True Gate",
        "this cluster serves no PodGroup API"
    );
    none_bound(&client, &ns).await;

    // A third node joins the pool: all three go, one per node.
    berth()
        .cluster
        .apply_app_policy("gang-fit", pool(&["gnode1", "gnode2", "gnode3"]));
    let bound = all_bound(&client, &ns, 3).await;
    let nodes: BTreeSet<&String> = bound.iter().map(|(_, n)| n).collect();
    assert_eq!(nodes.len(), 3, "5 cpus each: one per node; {bound:?}");
}

#[tokio::test]
async fn gang_members_that_avoid_each_other_go_together_on_distinct_nodes() {
    let client = berth().cluster.client().await;
    berth().cluster.apply_app_policy(
        "gang-apart",
        json!({"gang": {}, "avoid": {"matchLabels": {"podGroup": "ring"}}}),
    );
    let probe = json!({"app": "gang-apart"});
    let ns = opted_in(&client, "gang-apart", "gang-apart", probe, WAIT).await;
    let pods: Vec<Pod> = ["a", "b", "c"]
        .iter()
        .map(|n| gang_member("gang-apart", n, "ring", 3, "100m"))
        .collect();
    create_at_once(&client, &ns, pods).await;
    let bound = all_bound(&client, &ns, 3).await;
    let nodes: BTreeSet<&String> = bound.iter().map(|(_, n)| n).collect();
    assert_eq!(nodes.len(), 3, "{bound:?}");
}

/// A Deployment `name` of `replicas` pods of rank `rank` under policy `policy`; its
/// pods go Ready 2s after they start (kwok's `berth.test/ready-after`), or never
/// while `unready`.
fn ranked_deployment(policy: &str, name: &str, rank: i32, replicas: i32, unready: bool) -> String {
    let mut labels = json!({"app": policy, "svc": name, "berth.io/rank": rank.to_string()});
    if unready {
        labels["berth.test/unready"] = json!("true");
    }
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas,
            "selector": {"matchLabels": {"svc": name}},
            "template": {
                "metadata": {"labels": labels,
                    "annotations": {"berth.test/ready-after": "2s"}},
                "spec": {"containers": [{"name": "app", "image": format!("{name}:1"),
                    "resources": {"requests": {"cpu": "10m"}}}]}}}})
    .to_string()
}

/// The time the condition `kind` of `pod` last became True.
fn became_true(pod: &Pod, kind: &str) -> Option<Time> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")?;
    c.last_transition_time.clone()
}

fn rank(pod: &Pod) -> i32 {
    let labels = pod.metadata.labels.as_ref().expect("labels");
    labels["berth.io/rank"].parse().expect("rank")
}

/// Every pod of `ns`, once `count` of them are Ready.
async fn all_ready(client: &Client, ns: &str, count: usize) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(&format!("{count} pods Ready in {ns}"), WAIT, || async {
        let pods = api.list(&ListParams::default()).await.ok()?.items;
        let ready = pods.iter().filter(|p| became_true(p, "Ready").is_some());
        (ready.count() == count).then_some(pods)
    })
    .await
}

/// The pods of `ns` whose `svc` label is `svc`.
async fn pods_of(client: &Client, ns: &str, svc: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = ListParams::default().labels(&format!("svc={svc}"));
    api.list(&params).await.expect("list").items
}

#[tokio::test]
async fn ranks_start_in_order_each_after_the_lower_ranks_are_ready() {
    let client = berth().cluster.client().await;
    berth()
        .cluster
        .apply_app_policy("ranks", json!({"startOrder": {}}));
    let probe = json!({"app": "ranks", "berth.io/rank": "0"});
    let ns = opted_in(&client, "ranks", "ranks", probe, WAIT).await;
    // The whole release at once, highest rank first.
    let release: Vec<String> = (0..3)
        .rev()
        .map(|r| ranked_deployment("ranks", &format!("svc{r}"), r, 2, false))
        .collect();
    let out = support::kubectl_with_input(
        &berth().cluster.dir,
        &["apply", "-n", &ns, "-f", "-"],
        &release.join("\n---\n"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let pods = all_ready(&client, &ns, 6).await;
    for k in 1..3 {
        let first_scheduled = pods
            .iter()
            .filter(|p| rank(p) == k)
            .map(|p| became_true(p, "PodScheduled").expect("scheduled"))
            .min()
            .expect("pods of rank k");
        let last_ready_below = pods
            .iter()
            .filter(|p| rank(p) < k)
            .map(|p| became_true(p, "Ready").expect("ready"))
            .max()
            .expect("pods below rank k");
        // Lower ranks take 2s to go Ready after they start: had rank k gone
        // early, its scheduling would come seconds before.
        assert!(
            first_scheduled >= last_ready_below,
            "rank {k} scheduled at {:?}, before the last lower rank was Ready at {:?}",
            first_scheduled.0,
            last_ready_below.0
        );
    }
}

#[tokio::test]
async fn a_rank_waits_for_an_unready_lower_rank_and_for_its_new_replicas() {
    let client = berth().cluster.client().await;
    berth()
        .cluster
        .apply_app_policy("ranks-held", json!({"startOrder": {}}));
    let probe = json!({"app": "ranks-held", "berth.io/rank": "0"});
    let ns = opted_in(&client, "ranks-held", "ranks-held", probe, WAIT).await;
    let apply = |manifest: String| {
        let out = support::kubectl_with_input(
            &berth().cluster.dir,
            &["apply", "-n", &ns, "-f", "-"],
            &manifest,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    apply(ranked_deployment("ranks-held", "db", 0, 1, true));
    apply(ranked_deployment("ranks-held", "api", 1, 1, false));

    // The database runs but never goes Ready: the api stays gated, and its Event
    // names what it waits for (the database's own pod may have one of its own
    // first, for the seconds rank 0 waits for lower ranks created with it).
    let waiting = "rank 1 starts after rank 0 is Ready; Deployment/db has 0/1 replicas Ready";
    event_saying(&ns, "WaitingForLowerRank", waiting).await;
    let api_pod = &pods_of(&client, &ns, "api").await[0];
    assert!(
        gates(api_pod).iter().any(|g| g == names::RANK_GATE),
        "{api_pod:?}"
    );
    assert_eq!(node(api_pod), None);
    // `berth explain pod` says the same, live.
    let kubeconfig = berth().cluster.kubeconfig();
    let out = berth().run(&[
        "explain",
        "pod",
        api_pod.metadata.name.as_deref().unwrap(),
        "-n",
        &ns,
        "--kubeconfig",
        &kubeconfig.to_string_lossy(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gate = names::RANK_GATE;
    for line in [
        format!("= is held by the scheduling gate {gate} until every pod of a rank below 1"),
        format!("Now: held by the scheduling gate {gate}."),
        format!(
            "Waiting: WaitingForLowerRank: held by {gate}: rank 1 starts after rank 0 is Ready; Deployment/db has 0/1 replicas Ready"
        ),
    ] {
        assert!(text.contains(&line), "missing {line:?} in:\n{text}");
    }

    // Mid-way the database is scaled to two, and the first one goes Ready: the
    // api must still wait for the second, which goes Ready 2s after it may.
    apply(ranked_deployment("ranks-held", "db", 0, 2, true));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ready_up = json!({"metadata": {"labels": {"berth.test/unready": null}}});
    let db = eventually("two db pods", WAIT, || async {
        let db = pods_of(&client, &ns, "db").await;
        (db.len() == 2).then_some(db)
    })
    .await;
    let name = |p: &Pod| p.metadata.name.clone().expect("name");
    pods.patch(
        &name(&db[0]),
        &PatchParams::default(),
        &Patch::Merge(&ready_up),
    )
    .await
    .expect("first db pod Ready");
    eventually("the first db pod Ready", WAIT, || async {
        let pod = pods.get(&name(&db[0])).await.ok()?;
        became_true(&pod, "Ready").map(|_| ())
    })
    .await;
    pods.patch(
        &name(&db[1]),
        &PatchParams::default(),
        &Patch::Merge(&ready_up),
    )
    .await
    .expect("second db pod Ready");

    // Both Ready: the api is released, and the record shows it went after both.
    let all = all_ready(&client, &ns, 3).await;
    let db_ready = all
        .iter()
        .filter(|p| rank(p) == 0)
        .map(|p| became_true(p, "Ready").expect("ready"))
        .max()
        .unwrap();
    let api_scheduled = all
        .iter()
        .find(|p| rank(p) == 1)
        .and_then(|p| became_true(p, "PodScheduled"))
        .unwrap();
    assert!(
        api_scheduled >= db_ready,
        "{:?} < {:?}",
        api_scheduled.0,
        db_ready.0
    );
}

#[tokio::test]
async fn a_tenant_can_neither_release_its_gang_nor_claim_a_higher_queue_place() {
    let client = berth().cluster.client().await;
    berth()
        .cluster
        .apply_app_policy("gang-tenant", json!({"gang": {}, "queue": {}}));
    let probe = json!({"app": "gang-tenant"});
    let ns = opted_in(&client, "gang-tenant", "gang-tenant", probe, WAIT).await;
    let tenant = support::Tenant::new(berth().cluster, &format!("tenant-{ns}"), &ns).await;
    let as_tenant: Api<Pod> = Api::namespaced(tenant.client(berth().cluster).await, &ns);
    let queued = |name: &str, priority: &str| {
        let mut pod = gang_member("gang-tenant", name, "crew", 3, "100m");
        let labels = pod.metadata.labels.as_mut().unwrap();
        labels.insert("groupPriority".into(), priority.into());
        pod
    };
    for name in ["a", "b"] {
        as_tenant
            .create(&Default::default(), &queued(name, "1"))
            .await
            .expect("the tenant creates a member");
    }
    events(&ns, "WaitingForGang").await;

    // The gate is berth's: the tenant cannot lift it to start its half gang.
    let remove = r#"[{"op": "remove", "path": "/spec/schedulingGates/0"}]"#;
    let out = tenant.kubectl(
        berth().cluster,
        &["patch", "pod", "a", "--type=json", "-p", remove],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("only berth removes"),
        "{said}"
    );

    // Naming berth's class of a higher value buys nothing: berth sets the class of
    // the pod's own label (groupPriority 0, Burstable: 3 x 0 + 1), once the
    // controller has made the policy's classes.
    support::wait_admitted(
        &client,
        &ns,
        &queued("probe", "0"),
        "the controller made the queue's classes",
        |p| {
            p.spec
                .as_ref()
                .and_then(|s| s.priority_class_name.as_deref())
                == Some(names::queue_class("gang-tenant", 1).as_str())
        },
        WAIT,
    )
    .await;
    let mut forged = queued("c", "0");
    let spec = forged.spec.as_mut().unwrap();
    spec.priority_class_name = Some(names::queue_class("gang-tenant", 4));
    spec.priority = Some(4);
    let created = as_tenant
        .create(&Default::default(), &forged)
        .await
        .expect("admitted");
    let spec = created.spec.unwrap();
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some(names::queue_class("gang-tenant", 1).as_str())
    );
    assert_eq!(spec.priority, Some(1));

    // The third member completes the gang: berth releases all three, and none
    // before it.
    all_bound(&client, &ns, 3).await;
    held_until_created(&client, &ns, "c").await;
}
