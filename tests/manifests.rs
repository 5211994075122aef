#![cfg(feature = "e2e")]
//! `manifests/` renders with kustomize and every object in it passes the real
//! kube-apiserver's validation (server-side dry-run), as `kubectl apply -k` would
//! install it; the cert-manager overlay renders with its caBundle injection.

mod support;

use support::{Nodes, TestCluster};

const NODES: Nodes = Nodes {
    count: 1,
    prefix: "node",
};

#[test]
fn the_manifests_apply_with_server_side_dry_run() {
    let cluster = TestCluster::shared(NODES);
    let root = support::repo_root();
    let manifests = root.join("manifests");
    let rendered = cluster.kubectl_ok(&["kustomize", manifests.to_str().unwrap()]);
    for kind in [
        "kind: Namespace",
        "kind: CustomResourceDefinition",
        "kind: ServiceAccount",
        "kind: ClusterRole",
        "kind: ClusterRoleBinding",
        "kind: Service",
        "kind: Deployment",
        "kind: PodDisruptionBudget",
        "kind: MutatingWebhookConfiguration",
        "kind: ValidatingWebhookConfiguration",
        "kind: ValidatingAdmissionPolicy",
        "kind: ValidatingAdmissionPolicyBinding",
        "kind: MutatingAdmissionPolicy",
        "kind: MutatingAdmissionPolicyBinding",
    ] {
        assert!(rendered.contains(kind), "{kind} missing from manifests/");
    }
    // Namespaced objects can only be dry-run into a namespace that exists, and the
    // CRD must exist for nothing else to depend on: create those two for real.
    cluster.kubectl_ok(&[
        "apply",
        "-f",
        manifests.join("namespace.yaml").to_str().unwrap(),
    ]);
    cluster.kubectl_ok(&["apply", "-f", manifests.join("crd.yaml").to_str().unwrap()]);
    let applied = cluster.kubectl_ok(&[
        "apply",
        "--dry-run=server",
        "-k",
        manifests.to_str().unwrap(),
    ]);
    assert!(
        applied.contains("deployment.apps/berth created (server dry run)"),
        "{applied}"
    );
    assert!(applied.contains("mutatingwebhookconfiguration.admissionregistration.k8s.io/berth created (server dry run)"), "{applied}");
    // Nothing but the two objects above was written.
    let out = cluster.kubectl(&["get", "mutatingwebhookconfiguration", "berth"]);
    assert!(
        !out.status.success(),
        "the dry-run wrote the webhook configuration"
    );
}

#[test]
fn the_shipped_mutating_webhook_never_blocks_the_cluster() {
    let cluster = TestCluster::shared(NODES);
    let webhooks = support::repo_root().join("manifests/webhooks.yaml");
    let json = cluster.kubectl_ok(&[
        "create",
        "--dry-run=client",
        "-o",
        "json",
        "-f",
        webhooks.to_str().unwrap(),
    ]);
    let mutating: serde_json::Value = serde_json::Deserializer::from_str(&json)
        .into_iter::<serde_json::Value>()
        .map(Result::unwrap)
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .unwrap();
    let hook = &mutating["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Ignore");
    // It writes nothing on behalf of a review.
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["timeoutSeconds"], 3);
    assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
    assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
    assert_eq!(
        hook["rules"][0]["operations"],
        serde_json::json!(["CREATE"])
    );
    assert_eq!(hook["rules"][0]["resources"], serde_json::json!(["pods"]));
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(excluded["key"], "kubernetes.io/metadata.name");
    assert_eq!(excluded["operator"], "NotIn");
    assert_eq!(
        excluded["values"],
        serde_json::json!(["kube-system", "kube-node-lease", "berth-system"])
    );
    assert_eq!(
        hook["matchConditions"][0]["expression"],
        berth::admission::cel::NOT_FROM_NODES,
        "nodes are told by identity, as the admission policies tell them"
    );
}

#[test]
fn the_cert_manager_overlay_injects_the_ca() {
    let cluster = TestCluster::shared(NODES);
    let overlay = support::repo_root().join("certs/cert-manager");
    let rendered = cluster.kubectl_ok(&["kustomize", overlay.to_str().unwrap()]);
    assert_eq!(
        rendered
            .matches("cert-manager.io/inject-ca-from: berth-system/berth")
            .count(),
        2
    );
    assert!(rendered.contains("kind: Certificate") && rendered.contains("secretName: berth-tls"));
}
