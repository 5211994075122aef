#![cfg(feature = "e2e")]
//! The PlacementPolicy CRD on the real kube-apiserver: it installs, accepts every
//! example in `policies/`, prints its columns, and its schema refuses what it can
//! check (enums, weights, name length, a policy that grants nothing, unknown fields).

mod support;

use std::sync::OnceLock;

use support::{Nodes, TestCluster};

const NODES: Nodes = Nodes {
    count: 1,
    prefix: "node",
};

/// The cluster with the CRD installed and established, once per test binary.
fn cluster() -> &'static TestCluster {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let cluster = TestCluster::shared(NODES);
    INSTALLED.get_or_init(|| {
        let crd = support::repo_root().join("manifests/crd.yaml");
        cluster.kubectl_ok(&["apply", "-f", crd.to_str().unwrap()]);
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/placementpolicies.berth.io",
        ]);
    });
    cluster
}

/// Applies `yaml` with kubectl's default strict field validation; the error text.
fn rejected(yaml: &str) -> String {
    let file = std::env::temp_dir().join(format!(
        "berth-policy-{}-{}.yaml",
        std::process::id(),
        yaml.len()
    ));
    std::fs::write(&file, yaml).unwrap();
    let out = cluster().kubectl(&["apply", "--dry-run=server", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success(), "accepted:\n{yaml}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn policy(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: berth.io/v1alpha1\nkind: PlacementPolicy\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

#[test]
fn every_example_policy_is_accepted_and_listed_with_its_columns() {
    let dir = support::repo_root().join("policies");
    cluster().kubectl_ok(&["apply", "-f", dir.to_str().unwrap()]);
    let table = cluster().kubectl_ok(&["get", "bpp"]);
    let header = table.lines().next().unwrap();
    for column in ["NAME", "NODES", "DEDICATED", "PLACEMENT", "AGE"] {
        assert!(header.contains(column), "{header}");
    }
    let cdn = table
        .lines()
        .find(|l| l.starts_with("cdn "))
        .expect("cdn listed");
    assert!(
        cdn.contains("true") && cdn.contains("Required"),
        "defaults shown: {cdn}"
    );
}

#[test]
fn the_schema_rejects_what_it_can_check() {
    let cases = [
        (
            policy(
                "weight",
                "  pool: {nodeNames: [n], placement: Preferred, weight: 0}",
            ),
            "should be greater than or equal to 1",
        ),
        (
            policy("effect", "  pool: {nodeNames: [n], effect: Sometimes}"),
            "Unsupported value: \"Sometimes\"",
        ),
        (
            policy("placement", "  pool: {nodeNames: [n], placement: Maybe}"),
            "Unsupported value: \"Maybe\"",
        ),
        (
            policy("nothing", "  images: ['*cdn*']"),
            "a policy must grant something",
        ),
        (
            policy(&"x".repeat(51), "  schedulerName: s"),
            "policy names are at most 50 characters",
        ),
        (
            policy("unknown", "  schedulerName: s\n  colour: red"),
            "unknown field \"spec.colour\"",
        ),
        (
            policy(
                "anchors",
                "  avoid: {matchLabels: {app: a}}\n  anchorNamespaces: Some",
            ),
            "Unsupported value: \"Some\"",
        ),
    ];
    for (yaml, reason) in cases {
        let error = rejected(&yaml);
        assert!(error.contains(reason), "expected {reason:?} in: {error}");
    }
}
