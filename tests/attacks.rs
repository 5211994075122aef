#![cfg(feature = "e2e")]
//! Attacks a tenant can make with berth up, each tried as a tenant (a user with
//! the built-in `edit` role in its own namespace, through impersonation) on the
//! shipped manifests: work that would stall the apiserver or berth, reviews sent
//! to berth's port by anyone, exclusion got around with `spec.nodeName`, records
//! rewritten through the status subresource, queue priority raised, and a
//! DaemonSet on a dedicated pool written in the short form.
//!
//! berth runs as it would in front of untrusted tenants: `--client-ca` (only the
//! apiserver's client certificate gets a review answered) and 16 workers, as on a
//! many-core node. The same attacks with berth stopped are in
//! tests/enforcement_down.rs; forged records the missed scan must see through are
//! in tests/missed.rs; PodGroups in tests/podgroups.rs.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use berth::names;
use berth::policy::PlacementPolicy;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::attacks::{dry_run_cost, many_tolerations, worst_within_bounds};
use support::fixtures::{self, policy};
use support::fleet::{PeakRss, rss_kib};
use support::{Berth, Nodes, Tenant, eventually, fresh_namespace, is_bound, wait_for};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(90);

/// The memory limit of berth's container in the shipped manifests.
const SHIPPED_LIMIT_MIB: f64 = 384.0;

/// The policies every test here has in force.
fn policies() -> Vec<PlacementPolicy> {
    let apart = |role: &str| {
        json!({"podSelector": {"matchLabels": {"role": role}},
        "avoid": {"matchLabels": {"role": role}}})
    };
    let mut lonely = apart("lonely");
    lonely["anchorNamespaces"] = json!("All");
    vec![
        policy(
            "edge",
            json!({"images": ["*edge*"],
            "pool": {"nodeNames": ["node2"], "daemonSets": "Tolerate"}}),
        ),
        policy("apart", apart("apart")),
        policy("lonely", lonely),
        policy("sentinel", apart("sentinel")),
        policy(
            "jobs",
            json!({"podSelector": {"matchLabels": {"app": "jobs"}}, "queue": {}}),
        ),
    ]
}

/// Tests that load berth or the apiserver on purpose, or measure memory or CPU,
/// take this alone; every other test shares it. Beside the flood of 1 MB pods the
/// apiserver may take longer than its 3 s webhook timeout to hand berth a review:
/// a large one is then refused as late (fail closed, by design), and a small one
/// goes through without berth (`failurePolicy: Ignore`). So neither a test that
/// needs berth's answer nor one that measures runs beside a load.
static LOAD: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn berth() -> &'static Berth {
    static READY: OnceLock<()> = OnceLock::new();
    let berth = Berth::shared_with(
        NODES,
        &[],
        &[
            "--client-ca",
            "{cluster}/pki/webhook-client-ca.crt",
            "--worker-threads",
            "16",
        ],
    );
    READY.get_or_init(|| {
        berth.cluster.apply_policies(&policies());
        let deadline = Instant::now() + WAIT;
        // The pool's taint is on, so DaemonSets are judged against it.
        while !berth
            .cluster
            .kubectl_ok(&["get", "node", "node2", "-o", "jsonpath={.spec.taints}"])
            .contains(names::POOL_TAINT)
        {
            assert!(Instant::now() < deadline, "node2 was never tainted");
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    berth
}

/// A tenant in a fresh namespace opted into `policies` (none if empty), once
/// berth's webhook applies the first of them to `probe`.
async fn tenant(client: &Client, purpose: &str, policies: &str, probe: Pod) -> Tenant {
    let ns = fresh_namespace(client, purpose).await;
    if !policies.is_empty() {
        support::opt_in(client, &ns, policies, &probe, WAIT).await;
    }
    Tenant::new(berth().cluster, &format!("tenant-{ns}"), &ns).await
}

/// A small pod labelled `labels`.
fn labelled(labels: Value) -> Pod {
    support::test_pod("probe", labels, json!({}))
}

/// A small pod of the edge policy's image.
fn edge_pod(name: &str) -> Pod {
    fixtures::pod(name)
        .image("example/edge:1")
        .cpu("100m")
        .build()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::test]
async fn a_pod_with_tens_of_thousands_of_tolerations_is_refused_before_any_walk() {
    let _alone = LOAD.write().await;
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "tolerations", "", labelled(json!({}))).await;
    let as_tenant = tenant.client(berth().cluster).await;
    let (cpu, wall, answer) = dry_run_cost(
        berth().cluster,
        &as_tenant,
        &tenant.namespace,
        &many_tolerations(30_000),
    )
    .await;
    let refusal = answer.expect_err("refused");
    assert!(
        refusal.contains("at most 128"),
        "refused for its bound: {}",
        refusal.chars().take(300).collect::<String>()
    );
    let (worst_cpu, worst_wall, worst) = dry_run_cost(
        berth().cluster,
        &as_tenant,
        &tenant.namespace,
        &worst_within_bounds(),
    )
    .await;
    assert!(
        worst.is_ok(),
        "the worst pod within bounds is admitted: {worst:?}"
    );
    println!(
        "berth up: 30,000 tolerations refused in {wall:.2?}, kube-apiserver {cpu:.2} CPU-s; \
         the worst pod within bounds admitted in {worst_wall:.2?}, kube-apiserver {worst_cpu:.2} CPU-s"
    );
}

#[tokio::test]
async fn a_dozen_large_pending_pods_keep_berth_within_its_memory_limit() {
    let _alone = LOAD.write().await;
    let client = berth().cluster.client().await;
    let tenant = tenant(
        &client,
        "large",
        "sentinel",
        labelled(json!({"role": "sentinel"})),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(tenant.client(berth().cluster).await, &tenant.namespace);
    let peak = PeakRss::start(berth().pid());
    // Each about 1.2 MB of node affinity that no node satisfies: they stay Pending,
    // and the controller watches every one of them.
    let values: Vec<String> = (0..55_000).map(|i| format!("size-{i:016}")).collect();
    for i in 0..12 {
        let large = fixtures::pod(&format!("large-{i}"))
            .spec(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "example.com/size", "operator": "In", "values": values}]}]}}}}))
            .build();
        pods.create(&PostParams::default(), &large)
            .await
            .expect("a large pod within bounds is admitted");
    }
    // The controller's pod watch delivers in order: once it releases a pod created
    // after them, it has read all twelve.
    let sentinel = support::test_pod("sentinel", json!({"role": "sentinel"}), json!({}));
    pods.create(&PostParams::default(), &sentinel)
        .await
        .unwrap();
    wait_for(&pods, "sentinel", |p: Option<&Pod>| is_bound(p), WAIT).await;
    let after = mib(rss_kib(berth().pid()));
    println!(
        "twelve 1.2 MB pending pods: berth RSS peak {:.1} MiB, {after:.1} MiB after",
        peak.mib()
    );
    assert!(
        peak.mib() < SHIPPED_LIMIT_MIB,
        "berth's RSS reached {:.1} MiB, over the shipped limit",
        peak.mib()
    );
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_flood_of_large_dry_run_pods_keeps_berth_within_its_memory_limit() {
    let _alone = LOAD.write().await;
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "flood", "", labelled(json!({}))).await;
    let pods: Api<Pod> = Api::namespaced(tenant.client(berth().cluster).await, &tenant.namespace);
    // 250,000 one-letter values, 1 MB: each becomes a value berth reads.
    let big = fixtures::pod("flood")
        .spec(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "example.com/x", "operator": "In", "values": vec!["a"; 250_000]}]}]}}}}),
        )
        .build();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let peak = PeakRss::start(berth().pid());
    let deadline = Instant::now() + Duration::from_secs(20);
    let answers: Vec<Result<(), String>> = futures::stream::iter(0u64..)
        .take_while(|_| futures::future::ready(Instant::now() < deadline))
        .map(|i| {
            let (pods, dry_run) = (pods.clone(), dry_run.clone());
            let mut pod = big.clone();
            pod.metadata.name = Some(format!("flood-{i}"));
            async move {
                pods.create(&dry_run, &pod)
                    .await
                    .map(drop)
                    .map_err(|e| match e {
                        kube::Error::Api(status) => status.message,
                        other => other.to_string(),
                    })
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let allowed = answers.iter().filter(|a| a.is_ok()).count();
    println!(
        "flood of 1 MB dry-run pods, 32 at a time for 20 s, 16 workers: {} sent, {allowed} \
         allowed, berth RSS peak {:.1} MiB",
        answers.len(),
        peak.mib()
    );
    // Why the others failed, counted by message, so a run in which none passed says
    // whether berth refused them (and why), the apiserver timed out, or the client
    // gave up.
    let mut refusals: BTreeMap<&str, usize> = BTreeMap::new();
    for error in answers.iter().filter_map(|a| a.as_ref().err()) {
        *refusals.entry(error).or_default() += 1;
    }
    println!("refused: {refusals:#?}");
    assert!(allowed > 0, "berth answered none of the flood");
    assert!(
        peak.mib() < SHIPPED_LIMIT_MIB,
        "berth's RSS reached {:.1} MiB, over the shipped limit",
        peak.mib()
    );
}

#[tokio::test]
async fn pods_with_thousands_of_gates_stall_no_one_elses_admission() {
    let _alone = LOAD.write().await;
    let client = berth().cluster.client().await;
    let attacker = tenant(
        &client,
        "gates",
        "apart",
        labelled(json!({"role": "apart"})),
    )
    .await;
    let victim = tenant(&client, "victim", "edge", edge_pod("probe")).await;
    // Owned gates and berth's own, repeated: 30,000 of them.
    let gates: Vec<Value> = (0..30_000)
        .map(|i| match i % 2 {
            0 => json!({"name": names::AVOID_GATE}),
            _ => json!({"name": format!("example.com/g{i}")}),
        })
        .collect();
    let gated = fixtures::pod("gated")
        .labels(json!({"role": "apart"}))
        .spec(json!({"schedulingGates": gates}))
        .build();
    let attacks: Api<Pod> =
        Api::namespaced(attacker.client(berth().cluster).await, &attacker.namespace);
    let ordinary: Api<Pod> =
        Api::namespaced(victim.client(berth().cluster).await, &victim.namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let attack = futures::stream::iter(0u64..)
        .take_while(|_| futures::future::ready(Instant::now() < deadline))
        .map(|i| {
            let (api, dry_run) = (attacks.clone(), dry_run.clone());
            let mut pod = gated.clone();
            pod.metadata.name = Some(format!("gated-{i}"));
            async move {
                api.create(&dry_run, &pod)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>();
    let beside = async {
        let mut decided = Vec::new();
        let mut i = 0;
        while Instant::now() < deadline {
            let edge = edge_pod(&format!("edge-{i}"));
            let created = ordinary
                .create(&dry_run, &edge)
                .await
                .expect("an ordinary pod");
            decided.push(support::has_applied(&created, "edge"));
            i += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        decided
    };
    let (attacks, decided) = tokio::join!(attack, beside);
    // Refused for their bound, or, while others like them are read, at berth's
    // memory bound or out of time: refused either way, never admitted.
    let refused = |why: &str| {
        attacks
            .iter()
            .filter(|a| a.as_ref().is_err_and(|e| e.contains(why)))
            .count()
    };
    let (bound, busy, late) = (
        refused("at most 32"),
        refused("memory bound"),
        refused("in time"),
    );
    println!(
        "{} pods of 30,000 gates: {bound} refused for their bound, {busy} at berth's memory \
         bound, {late} out of time; {} ordinary pods beside, {} with berth's decision",
        attacks.len(),
        decided.len(),
        decided.iter().filter(|d| **d).count()
    );
    assert!(bound > 0, "gated pods are refused for their bound");
    assert_eq!(
        bound + busy + late,
        attacks.len(),
        "every gated pod refused"
    );
    // Creates one after another for 15 s, each with berth's decision (below):
    // a stalled webhook would have answered none of them in its 3 s.
    assert!(
        decided.len() >= 5,
        "ordinary pods went on beside the attack"
    );
    assert!(
        decided.iter().all(|d| *d),
        "every ordinary pod beside the attack got berth's decision"
    );
}

#[tokio::test]
async fn a_review_sent_by_anyone_but_the_apiserver_is_refused() {
    let _shared = LOAD.read().await;
    let client = berth().cluster.client().await;
    let ns = tenant(&client, "forged", "jobs", labelled(json!({"app": "jobs"})))
        .await
        .namespace;
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "forged-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns, "operation": "CREATE", "userInfo": {"username": "tenant"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "ghost", "namespace": ns,
                    "labels": {"app": "jobs", "groupPriority": "1000000"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    let ca = berth().certs_dir().join("ca.crt");
    let post = |path: &str, review: &Value| {
        let output = std::process::Command::new("curl")
            .args(["-sS", "-o", "/dev/stderr", "-w", "%{http_code}", "--cacert"])
            .arg(&ca)
            .args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                &review.to_string(),
            ])
            .arg(format!("https://127.0.0.1:{}{path}", berth().port))
            .output()
            .expect("curl");
        (text(&output.stdout), text(&output.stderr))
    };
    for path in ["/mutate", "/validate"] {
        let (status, body) = post(path, &review);
        assert_eq!(
            status, "403",
            "{path} without the apiserver's certificate: {body}"
        );
        assert!(body.contains("client CA"), "{body}");
        // It learns nothing of any namespace: a review naming another team's
        // namespace, which opts into nothing, gets the very same answer.
        let mut elsewhere = review.clone();
        elsewhere["request"]["namespace"] = json!("default");
        elsewhere["request"]["object"]["metadata"]["namespace"] = json!("default");
        assert_eq!(post(path, &elsewhere), (status, body), "{path}");
    }
    let (status, _) = {
        let output = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(&ca)
            .arg(format!("https://127.0.0.1:{}/healthz", berth().port))
            .output()
            .expect("curl");
        (text(&output.stdout), ())
    };
    assert_eq!(status, "200", "probes need no certificate");
    // Only the classes the policies allow exist: the controller's, none for a
    // review. jobs' queue keeps its default maxPriority.
    let allowed: BTreeSet<i32> = berth::policy::crd::Queue::default()
        .class_values()
        .collect();
    // Once the controller has made every class the policies allow, the values are
    // exactly those: a class made for the forged review would be one more.
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let made = eventually("berth's queue classes", WAIT, || async {
        let berths = classes
            .list(&ListParams::default().labels(&format!(
                "{}={}",
                names::MANAGED_BY_LABEL,
                names::FIELD_MANAGER
            )))
            .await
            .ok()?;
        let values: BTreeSet<i32> = berths.items.iter().filter_map(|c| c.value).collect();
        allowed.is_subset(&values).then_some(berths.items)
    })
    .await;
    for class in made {
        assert!(
            class.value.is_some_and(|v| allowed.contains(&v)),
            "PriorityClass {} of value {:?} is none the policies allow",
            class.name_any(),
            class.value
        );
    }
}

#[tokio::test]
async fn two_pods_naming_one_node_under_an_avoid_policy_do_not_both_land_there() {
    let _shared = LOAD.read().await;
    let client = berth().cluster.client().await;
    let tenant = tenant(
        &client,
        "named",
        "apart",
        labelled(json!({"role": "apart"})),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(tenant.client(berth().cluster).await, &tenant.namespace);
    let named = |name: &str| {
        support::test_pod(name, json!({"role": "apart"}), json!({"nodeName": "node1"}))
    };
    let params = PostParams::default();
    let (a, b) = (named("a"), named("b"));
    let (a, b) = tokio::join!(pods.create(&params, &a), pods.create(&params, &b));
    a.expect("a is admitted");
    b.expect("b is admitted");
    let (placed, held) = eventually("one of them placed on node1", WAIT, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let bound: Vec<&Pod> = list.items.iter().filter(|p| is_bound(Some(p))).collect();
        let [one] = bound[..] else { return None };
        let node = one.spec.as_ref()?.node_name.clone()?;
        let other = if one.name_any() == "a" { "b" } else { "a" };
        Some((node, other.to_string()))
    })
    .await;
    assert_eq!(placed, "node1");
    support::held_for_exclusion(
        &client,
        &tenant.namespace,
        &held,
        "every node where it fits",
    )
    .await;
    let other = pods.get(&held).await.unwrap();
    assert!(!is_bound(Some(&other)), "the other waits, held");
}

#[tokio::test]
async fn a_pair_an_avoid_policy_keeps_apart_on_one_node_is_reported() {
    let _shared = LOAD.read().await;
    let client = berth().cluster.client().await;
    let tenant = tenant(
        &client,
        "lonely",
        "lonely",
        labelled(json!({"role": "lonely"})),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(tenant.client(berth().cluster).await, &tenant.namespace);
    let own = support::test_pod("own", json!({"role": "lonely"}), json!({}));
    pods.create(&PostParams::default(), &own).await.unwrap();
    let placed = wait_for(&pods, "own", |p: Option<&Pod>| is_bound(p), WAIT)
        .await
        .unwrap();
    let node = placed.spec.unwrap().node_name.unwrap();
    // kube-system is never seen by berth's webhook: a pod there names the node.
    let system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let name = format!("lonely-{}", std::process::id());
    let intruder = support::test_pod(&name, json!({"role": "lonely"}), json!({"nodeName": node}));
    system
        .create(&PostParams::default(), &intruder)
        .await
        .unwrap();
    let condition = |status: &'static str| {
        let wanted = status;
        async move {
            eventually(&format!("ExclusionBroken {wanted}"), WAIT, || async {
                let out = berth().cluster.kubectl_ok(&[
                    "get",
                    "bpp",
                    "lonely",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"ExclusionBroken\")]}",
                ]);
                let c: Value = serde_json::from_str(&out).ok()?;
                (c["status"] == wanted)
                    .then(|| c["message"].as_str().unwrap_or_default().to_string())
            })
            .await
        }
    };
    let message = condition("True").await;
    assert!(
        message.contains(&format!("{}/own", tenant.namespace))
            && message.contains(&format!("kube-system/{name}")),
        "{message}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("an ExclusionBroken Event on the policy", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=ExclusionBroken"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("lonely")
                    && e.note.as_deref().is_some_and(|n| n.contains(&name))
            })
            .map(drop)
    })
    .await;
    assert_eq!(
        berth().metric("berth_exclusion_clashes{policy=\"lonely\"}"),
        Some(1.0)
    );
    system
        .delete(
            &name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let message = condition("False").await;
    assert!(message.contains("no two pods"), "{message}");
}

#[tokio::test]
async fn the_status_subresource_cannot_rewrite_berths_record() {
    let _shared = LOAD.read().await;
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "status", "edge", edge_pod("probe")).await;
    // The tenant may also write pod status (as some controllers may).
    berth().cluster.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: status-writer, namespace: {ns}}}\n\
         rules: [{{apiGroups: [''], resources: [pods/status], verbs: [get, update, patch]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: status-writer, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: status-writer}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]\n",
        ns = tenant.namespace,
        user = tenant.user
    ));
    let pods: Api<Pod> = Api::namespaced(tenant.client(berth().cluster).await, &tenant.namespace);
    let created = pods
        .create(&PostParams::default(), &edge_pod("edge"))
        .await
        .unwrap();
    assert!(support::has_applied(&created, "edge"));
    let patch = |annotations: Value| {
        let patch = json!({"metadata": {"annotations": annotations}}).to_string();
        tenant.kubectl(
            berth().cluster,
            &[
                "patch",
                "pod",
                "edge",
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ],
        )
    };
    // The status subresource writes annotations: another one goes through.
    eventually("the tenant may write pod status", WAIT, || async {
        patch(json!({"example.com/note": "hello"}))
            .status
            .success()
            .then_some(())
    })
    .await;
    let forged = patch(json!({names::APPLIED_ANNOTATION: null}));
    assert!(
        !forged.status.success(),
        "the record was rewritten through status"
    );
    assert!(
        text(&forged.stderr).contains(&format!("{} is berth's record", names::APPLIED_ANNOTATION)),
        "{}",
        text(&forged.stderr)
    );
    assert!(support::has_applied(
        &pods.get("edge").await.unwrap(),
        "edge"
    ));
}

#[tokio::test]
async fn queue_priority_stops_at_the_policys_ceiling_and_classes_stay_with_their_policy() {
    let _shared = LOAD.read().await;
    let client = berth().cluster.client().await;
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let top = berth::policy::crd::Queue::default()
        .class_values()
        .max()
        .unwrap();
    let top_class = names::queue_class("jobs", top);
    eventually("the controller made jobs' classes", WAIT, || async {
        classes.get_opt(&top_class).await.ok()?.map(drop)
    })
    .await;
    let queued = tenant(&client, "queued", "jobs", labelled(json!({"app": "jobs"}))).await;
    let manifest = fixtures::pod("eager")
        .labels(json!({"app": "jobs", "groupPriority": "1000000"}))
        .json()
        .to_string();
    let out = queued.create(berth().cluster, &manifest);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("counts as its maxPriority 10"),
        "the tenant is told: {}",
        text(&out.stderr)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &queued.namespace);
    let eager = pods.get("eager").await.unwrap().spec.unwrap();
    let class = eager.priority_class_name.unwrap_or_default();
    assert!(
        class.starts_with(&format!("{}jobs-", names::QUEUE_CLASS_PREFIX)),
        "{class}"
    );
    assert!(
        eager.priority.unwrap_or_default() <= top,
        "{:?}",
        eager.priority
    );

    // A namespace that does not opt into jobs cannot name its classes.
    let outsider = tenant(&client, "outsider", "", labelled(json!({}))).await;
    let manifest = fixtures::pod("jumper")
        .spec(json!({"priorityClassName": top_class}))
        .json()
        .to_string();
    let out = outsider.create(berth().cluster, &manifest);
    assert!(!out.status.success(), "a foreign queue class was taken");
    assert!(
        text(&out.stderr).contains("does not opt into"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn a_tenants_daemonset_stays_off_a_pool_that_names_no_daemonset_namespaces() {
    let _shared = LOAD.read().await;
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "agents", "", labelled(json!({}))).await;
    let daemonset = |name: &str, tolerations: Value| {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"tolerations": tolerations,
                        "containers": [{"name": "c", "image": "example/agent:1"}]}}}})
        .to_string()
    };
    for (name, tolerations) in [
        ("agent", json!([])),
        (
            "sneaky",
            json!([{"key": names::POOL_TAINT, "operator": "Exists"}]),
        ),
    ] {
        let out = tenant.create(berth().cluster, &daemonset(name, tolerations));
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant.namespace);
    // Each DaemonSet runs on the three nodes outside the pool.
    let placed = eventually("both DaemonSets on the three other nodes", WAIT, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let nodes: BTreeSet<(String, String)> = list
            .items
            .iter()
            .filter_map(|p| {
                Some((
                    p.labels().get("app")?.clone(),
                    p.spec.as_ref()?.node_name.clone()?,
                ))
            })
            .collect();
        (nodes.len() == 6).then_some(nodes)
    })
    .await;
    assert!(placed.iter().all(|(_, node)| node != "node2"), "{placed:?}");
    // Neither wants a pool node: berth kept both templates off the pool.
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &tenant.namespace);
    for name in ["agent", "sneaky"] {
        let status = daemonsets.get(name).await.unwrap().status;
        assert_eq!(
            status.map(|s| s.desired_number_scheduled),
            Some(3),
            "{name} wants the three nodes outside the pool"
        );
    }
}
