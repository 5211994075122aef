#![cfg(feature = "e2e")]
//! With berth stopped, no tenant pod reaches a dedicated node: the shipped
//! ValidatingAdmissionPolicies run in the apiserver (`failurePolicy: Fail`) and keep
//! the structural rules with no webhook at all. Each attempt is made as a tenant.
//! The cluster runs without the MutatingAdmissionPolicy `berth-placement`, as one
//! before 1.36 does (and as the pods it leaves to the webhook are):
//! `tests/placement_down.rs` runs berth down with it.
//!
//! Also here, since they need berth's webhook out of the way: a policy that stops
//! compiling keeps its last good version, and a pod naming thousands of unknown
//! policies stalls no controller pass.

mod support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use berth::names;
use berth::policy::PlacementPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::attacks::{dry_run_cost, many_tolerations, worst_within_bounds};
use support::fixtures::{self, policy};
use support::{Berth, Nodes, Replica, Tenant, eventually, fresh_namespace, wait_for};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);

/// Every pool a test in this file creates: `policies()`'s, and the ones
/// `a_controller_keeps_a_policy_that_stops_compiling...` adds while the others run.
/// A pod that keeps off all of them breaks no rule, whichever exist at the moment.
const EVERY_POOL: [&str; 4] = ["cdn", "gpu", "edge", "probe"];

/// The label pool gpu selects by: one only an administrator sets on a node.
const GPU_LABEL: &str = "node-restriction.kubernetes.io/gpu";

/// The pools and policies in force before berth stops.
fn policies() -> Vec<PlacementPolicy> {
    vec![
        policy(
            "cdn",
            json!({"images": ["*cdn*"],
            "pool": {"nodeNames": ["node2"], "daemonSets": "Tolerate"}}),
        ),
        policy(
            "apart",
            json!({"podSelector": {"matchLabels": {"role": "apart"}},
            "avoid": {"matchLabels": {"role": "apart"}}}),
        ),
        policy(
            "jobs",
            json!({"podSelector": {"matchLabels": {"app": "jobs"}}, "queue": {}}),
        ),
        policy(
            "gpu",
            json!({"pool": {"nodeSelector": {"matchLabels": {GPU_LABEL: "true"}}}}),
        ),
    ]
}

/// berth set up the pools (taints, and `status.nodeNames` for the selector pool)
/// and was then stopped: from here on no webhook answers.
fn berth_stopped() -> &'static Berth {
    static STOPPED: OnceLock<()> = OnceLock::new();
    let berth = Berth::shared_without_placement_policy(NODES);
    STOPPED.get_or_init(|| {
        berth
            .cluster
            .kubectl_ok(&["label", "node", "node3", &format!("{GPU_LABEL}=true")]);
        berth.cluster.apply_policies(&policies());
        let deadline = Instant::now() + WAIT;
        // The status and the taints are written by writers of their own: both
        // are waited for.
        berth.cluster.wait_for_pool("cdn", &["node2"], WAIT);
        berth.cluster.wait_for_pool("gpu", &["node3"], WAIT);
        let pid = berth.pid();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        while support::running(pid) {
            assert!(Instant::now() < deadline, "berth did not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    berth
}

/// Held while a controller replica runs in the cluster, and by the tests that need
/// none: a running controller releases a forged `berth.io/avoid` gate that names
/// no avoid policy, before the tenant's own attempt to remove it can be refused,
/// and adds the pool exclusion to a tenant's DaemonSet, before the DaemonSet
/// controller can be refused on a pool node.
static CONTROLLER_RUNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn tenant(client: &Client, purpose: &str) -> Tenant {
    let ns = fresh_namespace(client, purpose).await;
    Tenant::new(berth_stopped().cluster, &format!("tenant-{ns}"), &ns).await
}

/// The manifest of a pod of the cdn pool's image with `spec` merged in.
fn pod(name: &str, spec: Value) -> String {
    fixtures::pod(name)
        .image("example/cdn-uploader:1")
        .spec(spec)
        .json()
        .to_string()
}

fn cdn_toleration() -> Value {
    json!([{"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}])
}

#[tokio::test]
async fn with_berth_stopped_no_tenant_pod_reaches_a_dedicated_node() {
    let cluster = berth_stopped().cluster;
    let client = cluster.client().await;
    let tenant = tenant(&client, "down").await;
    let refused = |manifest: String, reason: &str| {
        let out = tenant.create(cluster, &manifest);
        assert!(!out.status.success(), "admitted: {}", text(&out.stdout));
        let error = text(&out.stderr);
        assert!(
            error.contains("ValidatingAdmissionPolicy") && error.contains(reason),
            "{error}"
        );
    };
    refused(
        pod("forged", json!({"tolerations": cdn_toleration()})),
        &format!("{}=cdn", names::POOL_TAINT),
    );
    refused(
        pod("named", json!({"nodeName": "node2"})),
        "dedicated pool cdn",
    );
    refused(
        pod("selected", json!({"nodeName": "node3"})),
        "dedicated pool gpu",
    );
    refused(
        pod("wildcard", json!({"tolerations": [{"operator": "Exists"}]})),
        "does not keep off dedicated pool",
    );

    // Nor by UPDATE: a pod held by a gate of its own gets a wildcard toleration.
    let held = json!({"schedulingGates": [{"name": "example.com/hold"}]});
    let out = tenant.create(cluster, &pod("held", held));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let patch =
        r#"[{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}]"#;
    let out = tenant.kubectl(
        cluster,
        &["patch", "pod", "held", "--type=json", "-p", patch],
    );
    assert!(!out.status.success(), "the wildcard went in");
    assert!(
        text(&out.stderr).contains("does not keep off dedicated pool"),
        "{}",
        text(&out.stderr)
    );

    // What breaks no rule goes on: berth down never blocks the cluster.
    let excluded = json!({"tolerations": [{"operator": "Exists"}], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": names::POOL_LABEL, "operator": "NotIn", "values": EVERY_POOL}]}]}}}});
    for (name, spec) in [
        ("plain", json!({})),
        ("elsewhere", json!({"nodeName": "node1"})),
        ("excluded", excluded),
    ] {
        let out = tenant.create(cluster, &pod(name, spec));
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }

    // A namespace that opts in keeps its pool, berth or no berth.
    let team = fresh_namespace(&client, "team").await;
    support::annotate(&client, &team, names::POLICIES_ANNOTATION, "cdn").await;
    let team = Tenant::new(cluster, &format!("tenant-{team}"), &team).await;
    let out = team.create(
        cluster,
        &pod("entitled", json!({"tolerations": cdn_toleration()})),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[tokio::test]
async fn with_berth_stopped_records_gates_and_bindings_hold() {
    let _no_controller = CONTROLLER_RUNS.lock().await;
    let cluster = berth_stopped().cluster;
    let client = cluster.client().await;
    let tenant = tenant(&client, "down-records").await;
    let gated = fixtures::pod("gated")
        .image("nginx")
        .annotations(json!({names::APPLIED_ANNOTATION: "cdn"}))
        .spec(json!({"schedulingGates": [{"name": names::AVOID_GATE}]}))
        .json();
    assert!(tenant.create(cluster, &gated.to_string()).status.success());
    let forged_record = format!("{}=gpu", names::APPLIED_ANNOTATION);
    for (args, reason) in [
        (
            vec!["annotate", "pod", "gated", &forged_record, "--overwrite"],
            "only berth sets it",
        ),
        (
            vec![
                "patch",
                "pod",
                "gated",
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/spec/schedulingGates/0"}]"#,
            ],
            "only berth removes",
        ),
    ] {
        let out = tenant.kubectl(cluster, &args);
        assert!(!out.status.success(), "{args:?} went through");
        assert!(text(&out.stderr).contains(reason), "{}", text(&out.stderr));
    }

    // A CI identity allowed to bind pods, binding one to the pool.
    let role = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: binder, namespace: {ns}}}\n\
         rules: [{{apiGroups: [\"\"], resources: [pods/binding], verbs: [create]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: binder, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: binder}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]\n",
        ns = tenant.namespace,
        user = tenant.user
    );
    cluster.apply(&role);
    assert!(
        tenant
            .create(
                cluster,
                &pod("waiting", json!({"nodeSelector": {"no-such": "node"}}))
            )
            .status
            .success()
    );
    let pods: Api<Pod> = Api::namespaced(tenant.client(cluster).await, &tenant.namespace);
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "waiting"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node3"}});
    let error = pods
        .create_subresource::<Value, Value>("binding", "waiting", &PostParams::default(), &binding)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("dedicated pool gpu"), "{error}");
}

#[tokio::test]
async fn with_berth_stopped_the_apiserver_refuses_an_oversized_pod_before_any_walk() {
    let cluster = berth_stopped().cluster;
    let client = cluster.client().await;
    let tenant = tenant(&client, "down-bounds").await;
    let as_tenant = tenant.client(cluster).await;
    let (cpu, wall, answer) = dry_run_cost(
        cluster,
        &as_tenant,
        &tenant.namespace,
        &many_tolerations(30_000),
    )
    .await;
    let refusal = answer.expect_err("refused");
    assert!(
        refusal.contains("'berth-limits'") && refusal.contains("at most 128"),
        "{}",
        refusal.chars().take(300).collect::<String>()
    );
    let (worst_cpu, worst_wall, worst) = dry_run_cost(
        cluster,
        &as_tenant,
        &tenant.namespace,
        &worst_within_bounds(),
    )
    .await;
    // Without berth to add its pool exclusion, berth-pools walks every term of it
    // for each pool, then refuses it.
    let refusal = worst.expect_err("refused");
    assert!(
        refusal.contains("'berth-pools'") && refusal.contains("does not keep off"),
        "{}",
        refusal.chars().take(300).collect::<String>()
    );
    println!(
        "berth down: 30,000 tolerations refused in {wall:.2?}, kube-apiserver {cpu:.2} CPU-s; \
         the worst pod within bounds refused in {worst_wall:.2?}, kube-apiserver {worst_cpu:.2} CPU-s"
    );
}

#[tokio::test]
async fn with_berth_stopped_no_hold_queue_or_status_record_can_be_forged() {
    let cluster = berth_stopped().cluster;
    let client = cluster.client().await;
    let tenant = tenant(&client, "down-forged").await;
    let refused = |manifest: String, policy: &str, reason: &str| {
        let out = tenant.create(cluster, &manifest);
        assert!(!out.status.success(), "admitted: {}", text(&out.stdout));
        let error = text(&out.stderr);
        assert!(error.contains(policy) && error.contains(reason), "{error}");
    };
    // A record of an avoid policy without its hold.
    let unheld = fixtures::pod("unheld")
        .image("nginx")
        .labels(json!({"role": "apart"}))
        .annotations(json!({names::APPLIED_ANNOTATION: "apart"}))
        .json();
    refused(unheld.to_string(), "'berth-holds'", names::AVOID_GATE);
    // A queue class of a policy the namespace does not opt into (the class exists,
    // as the controller would have made it).
    let class = names::queue_class("jobs", 30);
    cluster.apply(&format!(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {{name: {class}, \
         labels: {{{}: {}}}}}\nvalue: 30\npreemptionPolicy: Never\n",
        names::MANAGED_BY_LABEL,
        names::FIELD_MANAGER
    ));
    refused(
        pod("jumper", json!({"priorityClassName": class})),
        "'berth-queues'",
        "does not opt into",
    );
    // berth's record, rewritten through the status subresource by a tenant who may
    // write pod status.
    cluster.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: status-writer, namespace: {ns}}}\n\
         rules: [{{apiGroups: [''], resources: [pods/status], verbs: [get, update, patch]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: status-writer, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: status-writer}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]\n",
        ns = tenant.namespace,
        user = tenant.user
    ));
    let recorded = fixtures::pod("recorded")
        .image("nginx")
        .annotations(json!({names::APPLIED_ANNOTATION: "cdn"}))
        .json();
    assert!(
        tenant
            .create(cluster, &recorded.to_string())
            .status
            .success()
    );
    let patch = |annotations: Value| {
        let patch = json!({"metadata": {"annotations": annotations}}).to_string();
        tenant.kubectl(
            cluster,
            &[
                "patch",
                "pod",
                "recorded",
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ],
        )
    };
    eventually("the tenant may write pod status", WAIT, || async {
        patch(json!({"example.com/note": "hello"}))
            .status
            .success()
            .then_some(())
    })
    .await;
    let forged = patch(json!({names::APPLIED_ANNOTATION: "gpu"}));
    assert!(
        !forged.status.success(),
        "the record was rewritten through status"
    );
    assert!(
        text(&forged.stderr).contains("'berth-records'"),
        "{}",
        text(&forged.stderr)
    );
}

#[tokio::test]
async fn with_berth_stopped_a_tenants_daemonset_stays_off_the_pools() {
    let _no_controller = CONTROLLER_RUNS.lock().await;
    let cluster = berth_stopped().cluster;
    let client = cluster.client().await;
    let tenant = tenant(&client, "down-agents").await;
    // It tolerates every pool's taint; cdn takes DaemonSets, in the short form.
    let daemonset = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"tolerations": [{"key": names::POOL_TAINT, "operator": "Exists"}],
                    "containers": [{"name": "c", "image": "example/agent:1"}]}}}});
    let out = tenant.create(cluster, &daemonset.to_string());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &tenant.namespace);
    // The DaemonSet controller backs off after a refusal, so it may not have tried
    // both pool nodes yet; every refusal is for a pool.
    let refusals = eventually("FailedCreate for a pool node", WAIT, || async {
        let list = events
            .list(&kube::api::ListParams::default().fields("reason=FailedCreate"))
            .await
            .ok()?;
        let notes: Vec<String> = list.items.into_iter().filter_map(|e| e.note).collect();
        notes
            .iter()
            .any(|n| n.contains("pool=cdn") || n.contains("pool=gpu"))
            .then_some(notes)
    })
    .await;
    assert!(
        refusals.iter().all(|n| n.contains("does not opt into")),
        "{refusals:?}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant.namespace);
    let nodes: Vec<String> = pods
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.spec?.node_name)
        .collect();
    assert!(
        nodes.iter().all(|n| n != "node2" && n != "node3"),
        "{nodes:?}"
    );
}

#[tokio::test]
async fn a_controller_keeps_a_policy_that_stops_compiling_and_no_pod_stalls_it() {
    // Declared first, so it is let go after the replicas have stopped.
    let _controller = CONTROLLER_RUNS.lock().await;
    let berth = berth_stopped();
    let client = berth.cluster.client().await;
    // A controller-only replica, as the shipped ServiceAccount; the webhook stays down.
    let replica = Replica::start(
        berth,
        "standby",
        &berth.cluster.berth_service_account_kubeconfig(),
    );
    berth
        .cluster
        .apply_policies(&[policy("edge", json!({"pool": {"nodeNames": ["node4"]}}))]);
    let taint = || {
        berth
            .cluster
            .kubectl_ok(&["get", "node", "node4", "-o", "jsonpath={.spec.taints}"])
    };
    eventually("node4 in pool edge", WAIT, || async {
        taint().contains("edge").then_some(())
    })
    .await;

    // A bad glob, applied while /validate is down (failurePolicy Ignore lets it in):
    // the CRD's type takes it, berth's compiler does not.
    berth.cluster.apply_policies(&[policy(
        "edge",
        json!({"images": ["[edge"], "pool": {"nodeNames": ["node4"]}}),
    )]);
    let ready = eventually("Ready=False on edge", WAIT, || async {
        let out = berth
            .cluster
            .kubectl_ok(&["get", "bpp", "edge", "-o", "json"]);
        let policy: Value = serde_json::from_str(&out).ok()?;
        policy["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready" && c["status"] == "False")
            .cloned()
    })
    .await;
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("bad image glob") && message.contains("last good version stays in force"),
        "{message}"
    );
    assert!(taint().contains("edge"), "the pool's taint is kept");
    let status =
        berth
            .cluster
            .kubectl_ok(&["get", "bpp", "edge", "-o", "jsonpath={.status.nodeNames}"]);
    assert!(status.contains("node4"), "{status}");

    // A controller that never saw edge compile (a restart, a new leader) takes the
    // version the status records, and keeps the pool.
    replica.signal("-TERM");
    drop(replica);
    let kubeconfig = berth.cluster.berth_service_account_kubeconfig();
    let _successor = Replica::start(berth, "successor", &kubeconfig);
    eventually("the successor leads", Duration::from_secs(90), || async {
        (support::lease_holder(&client).await.as_deref() == Some("successor")).then_some(())
    })
    .await;
    // A second pool over node4, created now: edge is older and keeps the node, and
    // the successor says so in probe's status, computed in the same pass as node4's
    // state. Had the successor dropped edge, probe would have the node.
    berth
        .cluster
        .apply_policies(&[policy("probe", json!({"pool": {"nodeNames": ["node4"]}}))]);
    eventually("probe loses node4 to edge", WAIT, || async {
        let out = berth.cluster.kubectl_ok(&[
            "get",
            "bpp",
            "probe",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Conflict\")].message}",
        ]);
        out.contains("claimed by an older policy: node4")
            .then_some(())
    })
    .await;
    assert!(
        taint().contains("edge"),
        "the successor dropped edge's pool"
    );
    berth.cluster.kubectl_ok(&["delete", "bpp", "probe"]);

    // A pod that names thousands of policies its namespace never opted into (berth
    // was down, so its forged gate and record survived): one list of policy names
    // tells they are gone, however many it names, and it goes at once.
    let tenant = tenant(&client, "flood").await;
    let policies: Vec<String> = (0..3000).map(|i| format!("p{i}")).collect();
    let forged = fixtures::pod("flood")
        .image("nginx")
        .annotations(json!({names::APPLIED_ANNOTATION: policies.join(",")}))
        .spec(json!({"schedulingGates": [{"name": names::AVOID_GATE}]}))
        .json();
    let out = tenant.create(berth.cluster, &forged.to_string());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant.namespace);
    wait_for(
        &pods,
        "flood",
        |p: Option<&Pod>| {
            p.and_then(|p| p.spec.as_ref())
                .is_some_and(|s| s.scheduling_gates.as_deref().unwrap_or_default().is_empty())
        },
        WAIT,
    )
    .await;
}
