#![cfg(feature = "e2e")]
//! All-or-nothing in PodGroup mode, on a cluster that serves Kubernetes' own gang
//! scheduling (`up --generic-workload`: the `GenericWorkload` feature and
//! `scheduling.k8s.io/v1beta1`). berth finds it by discovery; the webhook joins
//! each member to its group (`spec.schedulingGroup`), the controller keeps the
//! PodGroup with `minCount`, and kube-scheduler places the whole group or none.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, api::DynamicObject, discovery::ApiResource};
use serde_json::json;
use support::{
    Berth, Nodes, Tenant, create_at_once, eventually, gang_member, is_bound, opted_in, test_pod,
    wait_for,
};

/// pgnode1..3 become the dedicated pool of the fit test; the others need three
/// nodes outside it.
const NODES: Nodes = Nodes {
    count: 6,
    prefix: "pgnode",
};
const WAIT: Duration = Duration::from_secs(120);

fn berth() -> &'static Berth {
    // A short resync: a PodGroup changed behind berth's back is checked on it.
    Berth::shared_with(NODES, &["--generic-workload"], &["--resync-seconds", "5"])
}

/// Waits until the policy's status shows the cluster's gang mode.
async fn gang_mode(policy: &str) -> String {
    eventually("the policy's gangMode", WAIT, || async {
        let out =
            berth()
                .cluster
                .kubectl(&["get", "bpp", policy, "-o", "jsonpath={.status.gangMode}"]);
        let mode = String::from_utf8_lossy(&out.stdout).into_owned();
        (!mode.is_empty()).then_some(mode)
    })
    .await
}

fn pod_groups(client: &Client, ns: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "scheduling.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "scheduling.k8s.io/v1beta1".into(),
        kind: "PodGroup".into(),
        plural: "podgroups".into(),
    };
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// The PodGroup every pod in `ns` joined (one for all), once the webhook set it
/// and the controller created it.
async fn the_pod_group(client: &Client, ns: &str) -> DynamicObject {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| {
            let spec = p.spec.as_ref().unwrap();
            let gates = spec.scheduling_gates.clone().unwrap_or_default();
            assert!(
                gates.is_empty(),
                "no berth gate in PodGroup mode: {gates:?}"
            );
            spec.scheduling_group
                .as_ref()
                .and_then(|g| g.pod_group_name.clone())
                .expect("the webhook joined the pod to a PodGroup")
        })
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let name = names.into_iter().next().unwrap();
    let api = pod_groups(client, ns);
    eventually(&format!("PodGroup {name}"), WAIT, || async {
        api.get_opt(&name).await.ok()?
    })
    .await
}

/// The status and reason of the scheduler's PodGroupInitiallyScheduled condition.
async fn initially_scheduled(client: &Client, ns: &str, name: &str) -> (String, String) {
    let api = pod_groups(client, ns);
    eventually("the scheduler's verdict on the PodGroup", WAIT, || async {
        let group = api.get(name).await.ok()?;
        let conditions = group.data["status"]["conditions"].as_array()?.clone();
        let c = conditions
            .iter()
            .find(|c| c["type"] == "PodGroupInitiallyScheduled")?;
        Some((
            c["status"].as_str()?.to_owned(),
            c["reason"].as_str()?.to_owned(),
        ))
    })
    .await
}

fn bound_count(pods: &[Pod]) -> usize {
    pods.iter().filter(|p| is_bound(Some(p))).count()
}

#[tokio::test]
async fn a_native_gang_waits_for_its_last_member_then_goes_at_once() {
    let client = berth().cluster.client().await;
    berth()
        .cluster
        .apply_app_policy("pg-count", json!({"gang": {}}));
    assert_eq!(gang_mode("pg-count").await, "PodGroup");
    let probe = json!({"app": "pg-count"});
    let ns = opted_in(&client, "pg-count", "pg-count", probe, WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create_at_once(
        &client,
        &ns,
        vec![
            gang_member("pg-count", "a", "g1", 3, "100m"),
            gang_member("pg-count", "b", "g1", 3, "100m"),
        ],
    )
    .await;
    let group = the_pod_group(&client, &ns).await;
    let name = group.metadata.name.clone().unwrap();
    assert_eq!(
        group.data["spec"]["schedulingPolicy"]["gang"]["minCount"],
        3
    );

    // A plain pod created after the PodGroup is bound: the scheduler has had
    // both members in front of it, and held them.
    pods.create(
        &PostParams::default(),
        &test_pod("plain", json!({}), json!({})),
    )
    .await
    .unwrap();
    wait_for(&pods, "plain", is_bound, WAIT).await;
    let held = pods
        .list(&ListParams::default().labels("app=pg-count"))
        .await
        .unwrap();
    assert_eq!(bound_count(&held.items), 0, "two of three");

    create_at_once(
        &client,
        &ns,
        vec![gang_member("pg-count", "c", "g1", 3, "100m")],
    )
    .await;
    assert_eq!(
        initially_scheduled(&client, &ns, &name).await,
        ("True".into(), "Scheduled".into())
    );
    let all = eventually("all three bound", WAIT, || async {
        let all = pods
            .list(&ListParams::default().labels("app=pg-count"))
            .await
            .ok()?;
        (bound_count(&all.items) == 3).then_some(all.items)
    })
    .await;
    // At once: no member was scheduled before the last one existed.
    let created = |pod: &Pod| pod.metadata.creation_timestamp.clone().expect("created").0;
    let last = all.iter().map(created).max().expect("three pods");
    for pod in &all {
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| c.last_transition_time.clone())
            .expect("a PodScheduled time")
            .0;
        assert!(
            scheduled >= last,
            "{:?} was scheduled at {scheduled}, before the last member was made at {last}",
            pod.metadata.name
        );
    }
}

#[tokio::test]
async fn a_native_gang_that_does_not_fit_stays_unbound_until_a_node_is_added() {
    let client = berth().cluster.client().await;
    let pool = |nodes: &[&str]| json!({"gang": {}, "pool": {"nodeNames": nodes}});
    berth()
        .cluster
        .apply_app_policy("pg-fit", pool(&["pgnode1", "pgnode2"]));
    // The pods come once the pool is in place: what they do not fit is room.
    berth()
        .cluster
        .wait_for_pool("pg-fit", &["pgnode1", "pgnode2"], WAIT);
    let probe = json!({"app": "pg-fit"});
    let ns = opted_in(&client, "pg-fit", "pg-fit", probe, WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let members = ["a", "b", "c"]
        .iter()
        .map(|n| gang_member("pg-fit", n, "big", 3, "5"))
        .collect();
    create_at_once(&client, &ns, members).await;
    let group = the_pod_group(&client, &ns).await;
    let name = group.metadata.name.clone().unwrap();
    // kube-scheduler's own record: the group does not fit, and none is bound.
    let (status, reason) = initially_scheduled(&client, &ns, &name).await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "Unschedulable")
    );
    let held = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(bound_count(&held.items), 0);

    berth()
        .cluster
        .apply_app_policy("pg-fit", pool(&["pgnode1", "pgnode2", "pgnode3"]));
    let bound = eventually("all three bound", WAIT, || async {
        let all = pods.list(&ListParams::default()).await.ok()?.items;
        (bound_count(&all) == 3).then_some(all)
    })
    .await;
    let nodes: BTreeSet<String> = bound
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(nodes.len(), 3, "5 cpus each: one per node");
}

#[tokio::test]
async fn native_gang_members_that_avoid_each_other_are_held_by_berth() {
    let client = berth().cluster.client().await;
    berth().cluster.apply_app_policy(
        "pg-apart",
        json!({"gang": {}, "avoid": {"matchLabels": {"podGroup": "ring"}}}),
    );
    let probe = json!({"app": "pg-apart"});
    let ns = opted_in(&client, "pg-apart", "pg-apart", probe, WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // What the webhook makes of a member (a dry run): berth's gang and avoid
    // gates (the controller lifts the avoid gate last), and no PodGroup.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let admitted = pods
        .create(&dry_run, &gang_member("pg-apart", "x", "ring", 3, "100m"))
        .await
        .unwrap();
    let spec = admitted.spec.unwrap();
    let gates: Vec<String> = spec
        .scheduling_gates
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.name)
        .collect();
    let gates: BTreeSet<String> = gates.into_iter().collect();
    assert_eq!(
        gates,
        BTreeSet::from([names::AVOID_GATE.into(), names::GANG_GATE.into()])
    );
    assert!(spec.scheduling_group.is_none());

    let members = ["a", "b", "c"]
        .iter()
        .map(|n| gang_member("pg-apart", n, "ring", 3, "100m"))
        .collect();
    create_at_once(&client, &ns, members).await;
    let bound = eventually("all three bound", WAIT, || async {
        let all = pods.list(&ListParams::default()).await.ok()?.items;
        (bound_count(&all) == 3).then_some(all)
    })
    .await;
    for pod in &bound {
        let spec = pod.spec.as_ref().unwrap();
        assert!(
            spec.scheduling_group.is_none(),
            "berth held it, not a PodGroup"
        );
    }
    let nodes: BTreeSet<String> = bound
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(nodes.len(), 3);
}

#[tokio::test]
async fn a_tenant_cannot_write_its_gangs_pod_group_and_a_changed_one_is_put_right() {
    let client = berth().cluster.client().await;
    berth()
        .cluster
        .apply_app_policy("pg-guard", json!({"gang": {}}));
    assert_eq!(gang_mode("pg-guard").await, "PodGroup");
    let probe = json!({"app": "pg-guard"});
    let ns = opted_in(&client, "pg-guard", "pg-guard", probe, WAIT).await;
    let tenant = Tenant::new(berth().cluster, &format!("tenant-{ns}"), &ns).await;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    // The tenant may write PodGroups (the edit role), but not berth's.
    let early = json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "berth-g1-early"},
        "spec": {"schedulingPolicy": {"basic": {}}}});
    let out = tenant.create(berth().cluster, &early.to_string());
    assert!(
        !out.status.success(),
        "a tenant made a PodGroup of berth's name"
    );
    assert!(
        text(&out.stderr).contains("berth-podgroups"),
        "{}",
        text(&out.stderr)
    );
    let own = early.to_string().replace("berth-g1-early", "mine");
    let out = tenant.create(berth().cluster, &own);
    assert!(out.status.success(), "its own: {}", text(&out.stderr));

    let members = Api::<Pod>::namespaced(tenant.client(berth().cluster).await, &ns);
    for name in ["a", "b"] {
        members
            .create(
                &PostParams::default(),
                &gang_member("pg-guard", name, "g1", 3, "100m"),
            )
            .await
            .unwrap();
    }
    let group = the_pod_group(&client, &ns).await;
    let name = group.metadata.name.clone().unwrap();
    let min_count =
        |to: u32| json!({"spec": {"schedulingPolicy": {"gang": {"minCount": to}}}}).to_string();
    let patch = [
        "patch",
        "podgroup.scheduling.k8s.io",
        &name,
        "--type=merge",
        "-p",
    ];
    let out = tenant.kubectl(berth().cluster, &[&patch[..], &[&min_count(1)]].concat());
    assert!(
        !out.status.success(),
        "a tenant lowered its gang's minCount"
    );
    assert!(
        text(&out.stderr).contains("berth-podgroups"),
        "{}",
        text(&out.stderr)
    );
    let out = tenant.kubectl(
        berth().cluster,
        &["delete", "podgroup.scheduling.k8s.io", &name],
    );
    assert!(
        !out.status.success(),
        "a tenant deleted its gang's PodGroup"
    );

    // Kubernetes' own controllers (any identity of kube-system's) may write
    // PodGroups; a change that is not berth's is put back.
    let controller = "system:serviceaccount:kube-system:pg-tamper";
    Tenant::new(berth().cluster, controller, &ns).await;
    let as_controller = ["--as", controller, "-n", &ns];
    let lowered = min_count(1);
    let args = [&as_controller[..], &patch[..], &[&lowered]].concat();
    berth().cluster.kubectl_ok(&args);
    let api = pod_groups(&client, &ns);
    eventually("minCount back at 3", WAIT, || async {
        let group = api.get(&name).await.ok()?;
        (group.data["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3).then_some(())
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let note = eventually("berth's PodGroupTampered Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=PodGroupTampered"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&name))
            .and_then(|e| e.note)
    })
    .await;
    assert!(note.contains("set back to 3"), "{note}");
}
