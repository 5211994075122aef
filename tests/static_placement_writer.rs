#![cfg(feature = "e2e")]
//! The controller keeps `StaticPlacement/berth`, the params of the admission
//! policies that place pods with berth down, equal to the compile of the policies
//! in force and the namespaces' image overrides, against the real apiserver; and
//! each policy's `InApiserver` condition says whether the apiserver applies it.

mod support;

use std::time::Duration;

use berth::names::IMAGES_ANNOTATION_PREFIX;
use berth::placement::static_placement::{StaticPlacement, StaticPlacementSpec};
use berth::policy::annotations::image_override;
use berth::policy::image_cel::glob_regex;
use berth::policy::{PlacementPolicy, PolicySet};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use support::fixtures::policy;
use support::{Berth, Nodes, annotate, eventually, fresh_namespace, wait_for};

const NODES: Nodes = Nodes {
    count: 2,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);

/// What the object should hold now: the policies as the apiserver stores them,
/// compiled, and the override `value`.
async fn expected(client: &Client, value: &str) -> StaticPlacementSpec {
    let policies: Api<PlacementPolicy> = Api::all(client.clone());
    let list = policies.list(&ListParams::default()).await.unwrap().items;
    let (set, errors): (PolicySet, _) = PolicySet::compile(&list);
    assert!(errors.is_empty(), "{errors:?}");
    StaticPlacementSpec::compile(&set, [value])
}

/// The policy's condition `InApiserver` as (status, reason, message).
async fn in_apiserver(client: &Client, name: &str) -> Option<(String, String, String)> {
    let policies: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<PlacementPolicy>(&()));
    let object = policies.get(name).await.ok()?;
    let conditions = object.data["status"]["conditions"].as_array()?;
    let c = conditions.iter().find(|c| c["type"] == "InApiserver")?;
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

#[tokio::test]
async fn the_static_placement_follows_the_policies_and_the_namespaces_overrides() {
    let berth = Berth::shared(NODES);
    let cluster = berth.cluster;
    let client = cluster.client().await;
    // Both CRDs as `berth crd` prints them; berth runs already, and its writer
    // retries until the StaticPlacement CRD is there.
    let crds = berth.run(&["crd"]);
    assert!(crds.status.success());
    let out = support::kubectl_with_input(
        &cluster.dir,
        &["apply", "-f", "-"],
        &String::from_utf8_lossy(&crds.stdout),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the StaticPlacement CRD is established", WAIT, || async {
        let wait = cluster.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=5s",
            "crd/staticplacements.berth.io",
        ]);
        wait.status.success().then_some(())
    })
    .await;

    cluster.apply_policies(&[
        policy("sp-pool", json!({"pool": {"nodeNames": ["node1"]}})),
        policy(
            "sp-apart",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                "avoid": {"matchLabels": {"app": "db"}}}),
        ),
    ]);
    let ns = fresh_namespace(&client, "overrides").await;
    let value = "registry.example.com/shop/*, shop/*";
    annotate(
        &client,
        &ns,
        &format!("{IMAGES_ANNOTATION_PREFIX}sp-pool"),
        value,
    )
    .await;

    let placements: Api<StaticPlacement> = Api::all(client.clone());
    let held = eventually("StaticPlacement/berth holds both policies", WAIT, || {
        let (placements, client) = (placements.clone(), client.clone());
        async move {
            let object = placements.get_opt("berth").await.ok()??;
            (object.spec == expected(&client, value).await).then_some(object)
        }
    })
    .await;
    let spec = &held.spec;
    let pool = spec.policy("sp-pool").unwrap();
    assert!(
        pool.required_pool && pool.webhook_only.is_none(),
        "{pool:?}"
    );
    assert_eq!(
        spec.policy("sp-apart").unwrap().webhook_only.as_deref(),
        Some("avoid needs the cluster's state, which only the webhook sees")
    );
    // The override's globs as one regex; "" while they cannot be matched by CEL
    // (what the stub of glob_regex on this branch gives for every glob).
    let regex = glob_regex(&image_override(value).unwrap()).unwrap_or_default();
    assert_eq!(spec.image_overrides.get(value), Some(&regex));

    let conditions = [
        (
            "sp-pool",
            (
                "True",
                "Compiled",
                "compiled for berth-placement: where it is installed, the apiserver applies this policy with berth down",
            ),
        ),
        (
            "sp-apart",
            (
                "False",
                "WebhookOnly",
                "avoid needs the cluster's state, which only the webhook sees",
            ),
        ),
    ];
    for (name, (status, reason, message)) in conditions {
        let want = (status.to_owned(), reason.to_owned(), message.to_owned());
        eventually(&format!("{name}: InApiserver {status}"), WAIT, || {
            let (client, want) = (client.clone(), want.clone());
            async move { (in_apiserver(&client, name).await? == want).then_some(()) }
        })
        .await;
    }

    // An edit of a policy: the object follows, in a write of its own.
    let before = held.resource_version().unwrap();
    let policies: Api<PlacementPolicy> = Api::all(client.clone());
    let patch = json!({"spec": {"schedulerName": "edge-scheduler"}});
    let edited = policies
        .patch("sp-pool", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert!(edited.metadata.generation > Some(1));
    let want = expected(&client, value).await;
    assert_eq!(
        want.policy("sp-pool").unwrap().scheduler_name.as_deref(),
        Some("edge-scheduler")
    );
    let followed = wait_for(
        &placements,
        "berth",
        move |object: Option<&StaticPlacement>| object.is_some_and(|o| o.spec == want),
        WAIT,
    )
    .await
    .unwrap();
    assert_ne!(followed.resource_version().unwrap(), before);
}
