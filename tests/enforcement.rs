#![cfg(feature = "e2e")]
//! A tenant tries to reach a dedicated pool, hide from the controller or stall it,
//! with berth running: every attempt of issue 10, each as the tenant (a user with
//! the built-in `edit` role in its own namespace, by impersonation), through the
//! real apiserver, against the shipped webhook configurations and
//! ValidatingAdmissionPolicies. Plus the correctness holes that need the cluster.
//!
//! Nodes: node1 and node4 are free, node2 is the `cdn` pool (it takes DaemonSets of
//! namespaces labelled `platform: agents`), node3 the `edge` pool (`daemonSets:
//! Exclude`), node5, node6 and node7 are for the tests that make pools of their own.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use berth::names;
use berth::objects::PodObject;
use berth::policy::PlacementPolicy;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::fixtures::{self, policy};
use support::{Berth, Nodes, Tenant, eventually, fresh_namespace, is_bound, wait_for};

const NODES: Nodes = Nodes {
    count: 7,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);
/// berth's own denial of `spec.nodeName node2` (the admission policy's says the
/// namespace does not opt in): it shows berth read and decided the pod.
const BERTH_DENIED_NODE2: &str = "\"pods.mutate.berth.io\" denied the request: spec.nodeName node2 is in dedicated pool cdn, which this pod is not entitled to";

/// Fake nodes have no kubelet to finish a graceful deletion: delete at once.
fn now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    }
}

/// The pools and the exclusion every test here has in force.
fn policies() -> Vec<PlacementPolicy> {
    vec![
        policy(
            "cdn",
            json!({"images": ["*cdn*"], "pool": {"nodeNames": ["node2"],
            "daemonSetNamespaces": {"matchLabels": {"platform": "agents"}}}}),
        ),
        policy(
            "edge",
            json!({"pool": {"nodeNames": ["node3"], "daemonSets": "Exclude"}}),
        ),
        policy(
            "redis-master",
            json!({"podSelector": {"matchLabels": {"role": "master"}},
            "avoid": {"matchLabels": {"role": "master"}}, "anchorNamespaces": "All"}),
        ),
    ]
}

/// A policy `name` for the pods labelled `role: <role>` that keeps them off the
/// nodes of the pods labelled `role: <avoid>`.
fn avoid_policy(name: &str, role: &str, avoid: &str) -> PlacementPolicy {
    policy(
        name,
        json!({"podSelector": {"matchLabels": {"role": role}},
        "avoid": {"matchLabels": {"role": avoid}}}),
    )
}

/// berth with the pools in place: both nodes tainted and listed in the policies'
/// status (what the admission policies read).
fn berth() -> &'static Berth {
    static READY: OnceLock<()> = OnceLock::new();
    let berth = Berth::shared(NODES);
    READY.get_or_init(|| {
        berth.cluster.apply_policies(&policies());
        for (policy, node) in [("cdn", "node2"), ("edge", "node3")] {
            berth.cluster.wait_for_pool(policy, &[node], WAIT);
        }
    });
    berth
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A tenant with `edit` in a fresh namespace of its own (opted into nothing).
async fn tenant(client: &Client, purpose: &str) -> Tenant {
    let ns = fresh_namespace(client, purpose).await;
    Tenant::new(berth().cluster, &format!("tenant-{ns}"), &ns).await
}

/// A tenant in a fresh namespace that opts into `policies`, probed with a pod
/// labelled `probe`.
async fn opted_in_tenant(client: &Client, purpose: &str, policies: &str, probe: Value) -> Tenant {
    let ns = support::opted_in(client, purpose, policies, probe, WAIT).await;
    Tenant::new(berth().cluster, &format!("tenant-{ns}"), &ns).await
}

/// Creating `manifest` as the tenant fails, with `reason` in the apiserver's answer.
fn refused(tenant: &Tenant, manifest: &str, reason: &str) {
    let out = tenant.create(berth().cluster, manifest);
    assert!(!out.status.success(), "admitted: {}", text(&out.stdout));
    let error = text(&out.stderr);
    assert!(error.contains(reason), "{error}");
}

fn pinned(nodes: &[&str]) -> Value {
    json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}}})
}

/// Waits until the scheduler records that it cannot place `name`: the cluster's own
/// record, not a pause.
async fn unschedulable(pods: &Api<Pod>, name: &str) {
    wait_for(
        pods,
        name,
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref()?.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                })
        },
        WAIT,
    )
    .await;
}

#[tokio::test]
async fn attack_1_a_forged_daemonset_owner_gets_no_pool_at_create_or_update() {
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "forged-owner").await;
    let owner = json!([{"apiVersion": "redteam.example.com/v1", "kind": "DaemonSet",
        "name": "fake", "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "controller": true}]);
    let forged = fixtures::pod("forged")
        .owners(owner.clone())
        .spec(json!({"nodeName": "node2",
        "tolerations": [{"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}]}))
        .json();
    refused(&tenant, &forged.to_string(), BERTH_DENIED_NODE2);
    // Even an apps/v1 DaemonSet owner: only the DaemonSet controller makes
    // DaemonSet pods.
    let mut apps = forged.clone();
    apps["metadata"]["ownerReferences"][0]["apiVersion"] = json!("apps/v1");
    refused(&tenant, &apps.to_string(), BERTH_DENIED_NODE2);

    // UPDATE: a pending pod gets the owner and the toleration in one JSON patch.
    let pending = fixtures::pod("pending")
        .spec(json!({"nodeSelector": {"no-such": "node"}}))
        .json();
    assert!(
        tenant
            .create(berth().cluster, &pending.to_string())
            .status
            .success()
    );
    let patch = json!([
        {"op": "add", "path": "/metadata/ownerReferences", "value": owner},
        {"op": "add", "path": "/spec/tolerations/-", "value":
            {"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}}]);
    let out = tenant.kubectl(
        berth().cluster,
        &[
            "patch",
            "pod",
            "pending",
            "--type=json",
            "-p",
            &patch.to_string(),
        ],
    );
    assert!(!out.status.success());
    let error = text(&out.stderr);
    assert!(
        error.contains("ownerReference") || error.contains(&format!("{}=cdn", names::POOL_TAINT)),
        "{error}"
    );
}

#[tokio::test]
async fn a_wildcard_toleration_added_by_update_is_refused() {
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "late-wildcard").await;
    // Held by a gate of the tenant's own, then given a wildcard toleration, the
    // gate to be removed after: the webhook sees only CREATE, so the admission
    // policy must refuse the UPDATE.
    let held = fixtures::pod("held")
        .spec(json!({"schedulingGates": [{"name": "example.com/hold"}], "nodeSelector": {"kubernetes.io/hostname": "node2"}}))
        .json();
    assert!(
        tenant
            .create(berth().cluster, &held.to_string())
            .status
            .success()
    );
    let patch =
        r#"[{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}]"#;
    let out = tenant.kubectl(
        berth().cluster,
        &["patch", "pod", "held", "--type=json", "-p", patch],
    );
    assert!(!out.status.success(), "the wildcard went in");
    assert!(
        text(&out.stderr).contains("does not keep off dedicated pool"),
        "{}",
        text(&out.stderr)
    );
    let harmless = r#"[{"op": "add", "path": "/spec/tolerations/-", "value": {"key": "example.com/gpu", "operator": "Exists"}}]"#;
    let out = tenant.kubectl(
        berth().cluster,
        &["patch", "pod", "held", "--type=json", "-p", harmless],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A pod manifest whose managedFields berth's old reader choked on.
fn poisoned(name: &str, fields: Value, spec: Value) -> Value {
    let managed = json!([{"manager": "redteam", "operation": "Apply", "apiVersion": "v1",
        "time": "9999-12-31T23:59:59Z", "fieldsType": "FieldsV1", "fieldsV1": fields}]);
    fixtures::pod(name)
        .metadata(json!({"managedFields": managed}))
        .labels(json!({"app": "poisoned"}))
        .spec(spec)
        .json()
}

fn nested(depth: usize) -> Value {
    let mut value = json!({"f:metadata": {}});
    for _ in 0..depth {
        value = json!({"f:spec": value});
    }
    value
}

#[tokio::test]
async fn attacks_2_and_3_managed_fields_out_of_range_or_too_deep_hide_nothing() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let tenant = tenant(&client, "poison").await;
    let wildcard = json!({"nodeName": "node2", "tolerations": [{"operator": "Exists"}]});
    // berth's own answer, not only the admission policy's: berth read the pod.
    refused(
        &tenant,
        &poisoned("late", json!({"f:metadata": {}}), wildcard.clone()).to_string(),
        BERTH_DENIED_NODE2,
    );
    refused(
        &tenant,
        &poisoned("deep", nested(140), wildcard).to_string(),
        BERTH_DENIED_NODE2,
    );

    // The tenant poisons two stored pods through an update of their managedFields
    // (the apiserver keeps what an update writes there): the controller's pod watch
    // and its relists must read past them.
    for (name, fields, time) in [
        (
            "harmless",
            json!({"f:metadata": {"f:labels": {}}}),
            "9999-12-31T23:59:59Z",
        ),
        (
            "deep",
            json!({"f:metadata": {"f:labels": {}}, "f:spec": nested(140)}),
            "2026-01-01T00:00:00Z",
        ),
    ] {
        let plain = fixtures::pod(name)
            .labels(json!({"app": "poisoned"}))
            .spec(json!({"nodeName": "node1"}))
            .json();
        let out = tenant.create(berth.cluster, &plain.to_string());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let patch = json!([{"op": "replace", "path": "/metadata/managedFields", "value": [{"manager": "redteam",
            "operation": "Update", "apiVersion": "v1", "time": time, "fieldsType": "FieldsV1", "fieldsV1": fields}]}]);
        let out = tenant.kubectl(
            berth.cluster,
            &[
                "patch",
                "pod",
                name,
                "--type=json",
                "-p",
                &patch.to_string(),
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let stored = tenant.kubectl(
        berth.cluster,
        &[
            "get",
            "pod",
            "harmless",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    );
    assert!(
        text(&stored.stdout).contains("9999-12-31T23:59:59Z"),
        "the apiserver dropped the poison"
    );
    let pods: Api<PodObject> = Api::all(client.clone());
    assert!(
        pods.list(&ListParams::default()).await.is_ok(),
        "berth's own reader reads a list holding it"
    );

    // The controller is not blind: a master created after it is gated, released
    // and bound.
    let team = support::opted_in(
        &client,
        "poison-team",
        "redis-master",
        json!({"role": "master"}),
        WAIT,
    )
    .await;
    let masters: Api<Pod> = Api::namespaced(client.clone(), &team);
    let master = support::test_pod("m", json!({"role": "master"}), json!({}));
    masters
        .create(&PostParams::default(), &master)
        .await
        .unwrap();
    wait_for(&masters, "m", is_bound, WAIT).await;

    // berth explain reads the poisoned pod too.
    let out = berth.run(&[
        "explain",
        "pod",
        "harmless",
        "-n",
        &tenant.namespace,
        "--kubeconfig",
        berth.cluster.kubeconfig().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("Now: bound to node node1."),
        "{}",
        text(&out.stdout)
    );
}

#[tokio::test]
async fn attack_4_a_review_of_many_megabytes_is_read_and_decided() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let tenant = tenant(&client, "large").await;
    // Sent by a client that writes '<' as is (kubectl would escape it itself and
    // meet the apiserver's own request limit); the apiserver then escapes each one
    // to six bytes in the review it sends berth.
    let pods: Api<Pod> = Api::namespaced(tenant.client(berth.cluster).await, &tenant.namespace);
    let large = |name: &str, size: usize, spec: Value| -> Pod {
        let mut p = fixtures::pod(name).spec(spec).json();
        p["spec"]["containers"][0]["env"] = json!([{"name": "X", "value": "<".repeat(size)}]);
        serde_json::from_value(p).unwrap()
    };
    // 1.15 MB of '<': a review of 6.9 MB.
    let spec = json!({"nodeName": "node2",
        "tolerations": [{"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}]});
    let error = pods
        .create(&PostParams::default(), &large("big", 1_150_000, spec))
        .await
        .unwrap_err();
    assert!(error.to_string().contains(BERTH_DENIED_NODE2), "{error}");

    // UPDATE: two objects of 600 kB each, then a toleration added.
    pods.create(
        &PostParams::default(),
        &large(
            "big-update",
            600_000,
            json!({"nodeSelector": {"no-such": "node"}}),
        ),
    )
    .await
    .expect("a large pod that breaks no rule");
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/spec/tolerations/-", "value":
        {"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}}]))
        .unwrap();
    let error = pods
        .patch(
            "big-update",
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("{}=cdn", names::POOL_TAINT)),
        "{error}"
    );
}

#[tokio::test]
async fn attack_5_a_tenant_cannot_write_berths_record() {
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "record").await;
    let plain = fixtures::pod("plain").json();
    assert!(
        tenant
            .create(berth().cluster, &plain.to_string())
            .status
            .success()
    );
    let out = tenant.kubectl(
        berth().cluster,
        &[
            "annotate",
            "pod",
            "plain",
            &format!("{}=cdn", names::APPLIED_ANNOTATION),
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("only berth sets it"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn attack_6_a_tenant_cannot_remove_berths_gate_from_its_own_held_pod() {
    berth()
        .cluster
        .apply_policies(&[avoid_policy("gatekeep", "gk", "gk")]);
    let client = berth().cluster.client().await;
    let tenant = opted_in_tenant(&client, "gate", "gatekeep", json!({"role": "gk"})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant.namespace);
    // A pod released first that can never be placed holds the next one back.
    let blocker = support::test_pod(
        "blocker",
        json!({"role": "gk"}),
        json!({"nodeSelector": {"no-such": "node"}}),
    );
    pods.create(&PostParams::default(), &blocker).await.unwrap();
    unschedulable(&pods, "blocker").await;
    let held = fixtures::pod("held").labels(json!({"role": "gk"})).json();
    assert!(
        tenant
            .create(berth().cluster, &held.to_string())
            .status
            .success()
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &tenant.namespace);
    eventually("HeldForExclusion", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=HeldForExclusion"))
            .await
            .ok()?;
        (!list.items.is_empty()).then_some(())
    })
    .await;

    let remove = r#"[{"op": "remove", "path": "/spec/schedulingGates/0"}]"#;
    let out = tenant.kubectl(
        berth().cluster,
        &["patch", "pod", "held", "--type=json", "-p", remove],
    );
    assert!(
        !out.status.success(),
        "the gate went: {}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("only berth removes"),
        "{}",
        text(&out.stderr)
    );
    let still = pods.get("held").await.unwrap();
    assert!(
        still
            .spec
            .unwrap()
            .scheduling_gates
            .unwrap()
            .iter()
            .any(|g| g.name == names::AVOID_GATE)
    );
    pods.delete("blocker", &now()).await.unwrap();
    wait_for(&pods, "held", is_bound, WAIT).await;
}

#[tokio::test]
async fn attack_7_a_tenants_stuck_look_alike_holds_no_master_back() {
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "lookalike").await;
    // Labelled like a redis master, never schedulable, in a namespace that opts
    // into nothing (anchorNamespaces: All makes it a pod masters avoid).
    let stuck = fixtures::pod("stuck")
        .labels(json!({"role": "master"}))
        .spec(json!({"nodeSelector": {"no-such": "node"}}))
        .json();
    assert!(
        tenant
            .create(berth().cluster, &stuck.to_string())
            .status
            .success()
    );
    let theirs: Api<Pod> = Api::namespaced(client.clone(), &tenant.namespace);
    unschedulable(&theirs, "stuck").await;

    let team = support::opted_in(
        &client,
        "masters",
        "redis-master",
        json!({"role": "master"}),
        WAIT,
    )
    .await;
    let masters: Api<Pod> = Api::namespaced(client.clone(), &team);
    masters
        .create(
            &PostParams::default(),
            &support::test_pod("m1", json!({"role": "master"}), json!({})),
        )
        .await
        .unwrap();
    wait_for(&masters, "m1", is_bound, WAIT).await;
}

fn daemonset(name: &str, tolerations: Value) -> String {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"tolerations": tolerations, "containers": [{"name": "c", "image": "busybox"}]}}}})
    .to_string()
}

/// The nodes the DaemonSet controller made pods of `name` for, once it has.
async fn daemonset_nodes(client: &Client, ns: &str, name: &str, at_least: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(client.clone(), ns);
    eventually(&format!("{name}'s pod for {at_least}"), WAIT, || async {
        // Every pod the DaemonSet controller means to make exists: the list below
        // is whole, not the first of its batches.
        let desired = support::daemonset_made_all(&daemonsets.get(name).await.ok()?)?;
        let list = pods
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await
            .ok()?;
        let nodes: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| {
                let terms = &p
                    .spec
                    .as_ref()?
                    .affinity
                    .as_ref()?
                    .node_affinity
                    .as_ref()?
                    .required_during_scheduling_ignored_during_execution
                    .as_ref()?
                    .node_selector_terms;
                terms
                    .first()?
                    .match_fields
                    .as_ref()?
                    .first()?
                    .values
                    .as_ref()?
                    .first()
                    .cloned()
            })
            .collect();
        let whole = nodes.len() == desired as usize;
        (whole && nodes.iter().any(|n| n == at_least)).then_some(nodes)
    })
    .await
}

#[tokio::test]
async fn attack_8_a_tenants_daemonset_reaches_neither_pool() {
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "ds").await;
    let forged = daemonset(
        "forged",
        json!([{"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}]),
    );
    assert!(tenant.create(berth().cluster, &forged).status.success());
    let everything = daemonset("everything", json!([{"operator": "Exists"}]));
    assert!(tenant.create(berth().cluster, &everything).status.success());
    for name in ["forged", "everything"] {
        let nodes = daemonset_nodes(&client, &tenant.namespace, name, "node1").await;
        assert!(
            !nodes.iter().any(|n| n == "node2" || n == "node3"),
            "{name} reached a pool: {nodes:?}"
        );
    }
    // A namespace the cdn pool takes DaemonSets from does get onto node2.
    let agents = fresh_namespace(&client, "agents").await;
    berth()
        .cluster
        .kubectl_ok(&["label", "namespace", &agents, "platform=agents"]);
    let out = support::kubectl_with_input(
        &berth().cluster.dir,
        &["create", "-n", &agents, "-f", "-"],
        &daemonset("agent", json!([])),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let nodes = daemonset_nodes(&client, &agents, "agent", "node2").await;
    assert!(
        !nodes.iter().any(|n| n == "node3"),
        "edge excludes DaemonSets: {nodes:?}"
    );
}

#[tokio::test]
async fn daemonsets_that_predate_a_pool_are_brought_in_line() {
    let client = berth().cluster.client().await;
    let agents = fresh_namespace(&client, "old-agents").await;
    berth()
        .cluster
        .kubectl_ok(&["label", "namespace", &agents, "platform=old-agents"]);
    let out = support::kubectl_with_input(
        &berth().cluster.dir,
        &["create", "-n", &agents, "-f", "-"],
        &daemonset("logs", json!([])),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    daemonset_nodes(&client, &agents, "logs", "node5").await;

    berth().cluster.apply_policies(&[policy(
        "late",
        json!({"pool": {"nodeNames": ["node5"],
            "daemonSetNamespaces": {"matchLabels": {"platform": "old-agents"}}}}),
    )]);
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &agents);
    wait_for(
        &daemonsets,
        "logs",
        |d: Option<&DaemonSet>| {
            d.and_then(|d| d.spec.template.spec.as_ref()?.tolerations.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.value.as_deref() == Some("late")))
        },
        WAIT,
    )
    .await;
    // The agent pod on node5 goes (evicted, deleted; or already replaced by the
    // DaemonSet's rolling update, as kwok runs the pods); the DaemonSet makes it again.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &agents);
    let list = pods
        .list(&ListParams::default().labels("app=logs"))
        .await
        .unwrap();
    for p in list.items {
        match pods.delete(&p.metadata.name.unwrap(), &now()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => panic!("deleting an agent pod: {e}"),
        }
    }
    let nodes = daemonset_nodes(&client, &agents, "logs", "node5").await;
    assert!(nodes.contains(&"node5".to_string()));
}

#[tokio::test]
async fn attack_10_a_binding_to_a_pool_node_is_refused_unless_the_namespace_opts_in() {
    let client = berth().cluster.client().await;
    let tenant = tenant(&client, "binder").await;
    let role = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: binder, namespace: {ns}}}\n\
         rules: [{{apiGroups: [\"\"], resources: [pods/binding, bindings], verbs: [create]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: binder, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: binder}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]\n",
        ns = tenant.namespace,
        user = tenant.user
    );
    berth().cluster.apply(&role);
    for name in ["to-pool", "to-free"] {
        let waiting = fixtures::pod(name)
            .spec(json!({"nodeSelector": {"no-such": "node"}}))
            .json();
        assert!(
            tenant
                .create(berth().cluster, &waiting.to_string())
                .status
                .success()
        );
    }
    let as_tenant = tenant.client(berth().cluster).await;
    let pods: Api<Pod> = Api::namespaced(as_tenant, &tenant.namespace);
    let bind = |pod: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    };
    let params = PostParams::default();
    let error = pods
        .create_subresource::<Value, Value>(
            "binding",
            "to-pool",
            &params,
            &bind("to-pool", "node2"),
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("dedicated pool cdn"), "{error}");
    // The older `bindings` resource binds just the same.
    let legacy: Api<k8s_openapi::api::core::v1::Binding> =
        Api::namespaced(tenant.client(berth().cluster).await, &tenant.namespace);
    let binding = serde_json::from_value(bind("to-pool", "node2")).unwrap();
    let error = legacy.create(&params, &binding).await.unwrap_err();
    assert!(error.to_string().contains("dedicated pool cdn"), "{error}");
    pods.create_subresource::<Value, Value>(
        "binding",
        "to-free",
        &params,
        &bind("to-free", "node1"),
    )
    .await
    .expect("binding to a free node is the tenant's business");
}

#[tokio::test]
async fn a_pod_with_a_node_name_under_an_avoid_policy_is_pinned_held_and_placed_there() {
    berth()
        .cluster
        .apply_policies(&[avoid_policy("named", "named", "named")]);
    let client = berth().cluster.client().await;
    let team = support::opted_in(&client, "named", "named", json!({"role": "named"}), WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &team);
    let named = support::test_pod(
        "named",
        json!({"role": "named"}),
        json!({"nodeName": "node1"}),
    );
    let created = pods
        .create(&PostParams::default(), &named)
        .await
        .expect("the apiserver takes it");
    let spec = created.spec.expect("a spec");
    // The apiserver refuses a gated pod with a node name: berth turned the name
    // into a term so that the pod is held like any other.
    assert_eq!(spec.node_name, None, "the name became a term");
    let gates: Vec<String> = spec
        .scheduling_gates
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert!(gates.iter().any(|g| g == names::AVOID_GATE), "{gates:?}");
    let terms = spec
        .affinity
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.required_during_scheduling_ignored_during_execution)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    assert!(
        !terms.is_empty()
            && terms.iter().all(|t| t
                .match_fields
                .iter()
                .flatten()
                .any(|f| f.key == "metadata.name"
                    && f.values.as_deref() == Some(&["node1".to_string()][..]))),
        "every term pins node1: {terms:?}"
    );
    let placed = wait_for(&pods, "named", |p: Option<&Pod>| support::is_bound(p), WAIT)
        .await
        .expect("released and placed");
    assert_eq!(
        placed.spec.and_then(|s| s.node_name).as_deref(),
        Some("node1")
    );
}

#[tokio::test]
async fn a_policy_being_deleted_stops_granting_at_once() {
    let mut leaving = policy("leaving", json!({"schedulerName": "leaving-scheduler"}));
    leaving.metadata.finalizers = Some(vec!["test.berth.io/hold".into()]);
    berth().cluster.apply_policies(&[leaving]);
    let client = berth().cluster.client().await;
    let ns = support::opted_in(&client, "leaving", "leaving", json!({}), WAIT).await;
    berth()
        .cluster
        .kubectl_ok(&["delete", "bpp", "leaving", "--wait=false"]);
    let probe = support::test_pod("probe", json!({}), json!({}));
    support::wait_admitted(
        &client,
        &ns,
        &probe,
        "leaving no longer applied",
        |p| !support::has_applied(p, "leaving"),
        WAIT,
    )
    .await;
    berth().cluster.kubectl_ok(&[
        "patch",
        "bpp",
        "leaving",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
}

#[tokio::test]
async fn a_policys_finalizer_waits_for_its_own_nodes_only() {
    let berth = berth();
    // berth may not write node6: every write to it fails.
    berth.cluster.apply(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: test-node6-frozen}\n\
         spec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules: [{apiGroups: [\"\"], apiVersions: [v1], operations: [UPDATE], resources: [nodes]}]\n  \
         matchConditions: [{name: berth-on-node6, expression: \"request.userInfo.username == 'system:serviceaccount:berth-system:berth' && object.metadata.name == 'node6'\"}]\n  \
         validations: [{expression: \"false\", message: node6 is frozen for this test}]\n---\n\
         apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: test-node6-frozen}\n\
         spec: {policyName: test-node6-frozen, validationActions: [Deny]}\n",
    );
    // Once the apiserver enforces it (a policy takes effect a moment after it is
    // written), a pool claims node6.
    let tries = std::sync::atomic::AtomicU32::new(0);
    eventually("node6 frozen for berth", WAIT, || async {
        // A new value each time: a label already set is no request at all.
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let label = format!("probe={n}");
        let out = berth.cluster.kubectl(&[
            "--as",
            names::BERTH_SERVICE_ACCOUNT,
            "label",
            "node",
            "node6",
            &label,
            "--overwrite",
        ]);
        text(&out.stderr).contains("node6 is frozen").then_some(())
    })
    .await;
    berth
        .cluster
        .apply_policies(&[policy("frozen", json!({"pool": {"nodeNames": ["node6"]}}))]);
    eventually("a failed write to node6", WAIT, || async {
        berth.log().contains("node6 is frozen").then_some(())
    })
    .await;
    berth
        .cluster
        .apply_policies(&[policy("gone", json!({"pool": {"nodeNames": ["node7"]}}))]);
    eventually("node7 in pool gone", WAIT, || async {
        let taint =
            berth
                .cluster
                .kubectl_ok(&["get", "node", "node7", "-o", "jsonpath={.spec.taints}"]);
        taint.contains("gone").then_some(())
    })
    .await;
    berth
        .cluster
        .kubectl_ok(&["delete", "bpp", "gone", "--wait=false"]);
    eventually("policy gone deleted despite node6", WAIT, || async {
        let out = berth.cluster.kubectl(&["get", "bpp", "gone"]);
        (!out.status.success()).then_some(())
    })
    .await;
    let node7 = berth
        .cluster
        .kubectl_ok(&["get", "node", "node7", "-o", "json"]);
    assert!(
        !node7.contains(names::POOL_TAINT) && !node7.contains("berth.pool"),
        "{node7}"
    );
    // node6 thawed, so that no later test meets a node berth cannot write.
    berth.cluster.kubectl_ok(&[
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        "test-node6-frozen",
    ]);
    berth.cluster.kubectl_ok(&["delete", "bpp", "frozen"]);
}

#[tokio::test]
async fn a_pod_still_terminating_counts_for_avoid() {
    berth()
        .cluster
        .apply_policies(&[avoid_policy("apart", "apart", "apart")]);
    let client = berth().cluster.client().await;
    let ns = support::opted_in(&client, "apart", "apart", json!({"role": "apart"}), WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut first = support::test_pod("a1", json!({"role": "apart"}), pinned(&["node4"]));
    first.metadata.finalizers = Some(vec!["test.berth.io/hold".into()]);
    pods.create(&PostParams::default(), &first).await.unwrap();
    wait_for(&pods, "a1", is_bound, WAIT).await;
    // a1 has run a while: node4 carries its anchor label.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let label = names::anchor_label("apart");
    wait_for(
        &nodes,
        "node4",
        |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.and_then(|n| n.metadata.labels.as_ref())
                .is_some_and(|l| l.contains_key(&label))
        },
        WAIT,
    )
    .await;
    pods.delete("a1", &now()).await.unwrap();

    // A surge: the replacement arrives while a1 is still terminating on node4, the
    // one node where it fits. berth holds it rather than let it go narrowed off
    // node4 for good.
    pods.create(
        &PostParams::default(),
        &support::test_pod("a2", json!({"role": "apart"}), pinned(&["node4"])),
    )
    .await
    .unwrap();
    support::held_for_exclusion(&client, &ns, "a2", "every node where it fits").await;
    let patch = json!({"metadata": {"finalizers": null}});
    pods.patch("a1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&pods, "a2", is_bound, WAIT).await;
}

#[tokio::test]
async fn avoid_is_symmetric_a_later_target_keeps_off_the_policys_nodes() {
    berth()
        .cluster
        .apply_policies(&[avoid_policy("primaries", "primary", "secondary")]);
    let client = berth().cluster.client().await;
    let ns = support::opted_in(
        &client,
        "primaries",
        "primaries",
        json!({"role": "primary"}),
        WAIT,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &support::test_pod("p1", json!({"role": "primary"}), pinned(&["node1"])),
    )
    .await
    .unwrap();
    wait_for(&pods, "p1", is_bound, WAIT).await;
    // The secondary comes later: it keeps off node1, as it would with required
    // anti-affinity on the primary. Pinned to node1, it waits held, with berth's
    // word on why.
    pods.create(
        &PostParams::default(),
        &support::test_pod("s1", json!({"role": "secondary"}), pinned(&["node1"])),
    )
    .await
    .unwrap();
    support::held_for_exclusion(&client, &ns, "s1", "every node where it fits").await;
    pods.create(
        &PostParams::default(),
        &support::test_pod(
            "s2",
            json!({"role": "secondary"}),
            pinned(&["node1", "node4"]),
        ),
    )
    .await
    .unwrap();
    let s2 = wait_for(&pods, "s2", is_bound, WAIT).await.unwrap();
    assert_eq!(s2.spec.unwrap().node_name.as_deref(), Some("node4"));
}
