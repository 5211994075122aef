#![cfg(feature = "e2e")]
//! SPEC scenarios 1, 3, 4 and 5 with the real scheduler: the webhook rewrites the
//! pods, the controller keeps node labels and taints, and the unmodified
//! kube-scheduler places them.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use berth::names;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::fixtures::{self, PodFixture};
use support::{
    Berth, Nodes, annotate, fresh_namespace, is_bound, opt_in, placed, wait_admitted, wait_for,
};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);

fn berth() -> &'static Berth {
    Berth::shared(NODES)
}

/// The spill test sizes its pods from node4's free CPU, so that two fit and a third
/// does not: it runs alone, while no other test's pod can land there between its
/// count and its pods; every other test here shares this.
static NODE4_CPU: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Applies a file from `policies/` once per test binary.
fn policy(file: &str) {
    static APPLIED: OnceLock<std::sync::Mutex<Vec<String>>> = OnceLock::new();
    let applied = APPLIED.get_or_init(Default::default);
    let mut applied = applied.lock().unwrap();
    if applied.iter().any(|f| f == file) {
        return;
    }
    let path = support::repo_root().join("policies").join(file);
    let out = berth()
        .cluster
        .kubectl(&["apply", "-f", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    applied.push(file.to_owned());
}

/// Waits until the controller has put `key` (with `value`) on `node` *and* the
/// scheduler has seen it: the scheduler has a node cache of its own, so a label
/// visible through the API may not steer it yet. A probe pod that needs the label
/// (in berth-system, which berth never mutates, tolerating everything) is bound
/// only once the scheduler knows it. berth writes taints before labels, so the
/// pool taint is known by then too.
async fn node_label(client: &Client, node: &str, key: &str, value: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(
        &nodes,
        node,
        |n: Option<&Node>| {
            n.and_then(|n| n.metadata.labels.as_ref())
                .and_then(|l| l.get(key))
                .map(String::as_str)
                == Some(value)
        },
        WAIT,
    )
    .await;
    let probes: Api<Pod> = Api::namespaced(client.clone(), "berth-system");
    let name = format!("probe-{}-{}", node, std::process::id());
    let name = format!(
        "{name}-{}",
        NEXT_PROBE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let probe = pod(&name, "busybox")
        .spec(
            json!({"nodeSelector": {"kubernetes.io/hostname": node, key: value},
               "tolerations": [{"operator": "Exists"}]}),
        )
        .build();
    probes
        .create(&PostParams::default(), &probe)
        .await
        .expect("create probe");
    wait_for(&probes, &name, is_bound, WAIT).await;
}

/// Waits until node2 is in the cdn pool as far as the scheduler knows.
async fn cdn_pool_on_node2(client: &Client) {
    node_label(client, "node2", names::POOL_LABEL, "cdn").await;
}

static NEXT_PROBE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A pod of `image` that requests 100m CPU and 32Mi.
fn pod(name: &str, image: &str) -> PodFixture {
    fixtures::pod(name).image(image).cpu("100m").memory("32Mi")
}

#[tokio::test]
async fn seed_000_cdn_pods_land_on_node2_and_nothing_else_does() {
    let _shared = NODE4_CPU.read().await;
    let client = berth().cluster.client().await;
    policy("cdn.yaml");
    opt_in(
        &client,
        "default",
        "cdn",
        &pod("probe", "example/cdn-uploader:1.0").build(),
        WAIT,
    )
    .await;
    cdn_pool_on_node2(&client).await;
    let other = fresh_namespace(&client, "other").await;

    // 50 pods on 4 nodes: cdn pods in default, nginx pods in default, and cdn
    // images in a namespace that did not opt in.
    let mut expected: Vec<(String, String, bool)> = Vec::new();
    for i in 0..50 {
        let (ns, image, cdn) = match i % 4 {
            0 | 2 => ("default", "example/cdn-uploader:1.0", true),
            1 => ("default", "nginx:1.27", false),
            _ => (other.as_str(), "example/cdn-uploader:1.0", false),
        };
        let name = format!("seed-{i}");
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        pods.create(
            &PostParams::default(),
            &pod(&name, image)
                .labels(json!({"test": "seed-000"}))
                .build(),
        )
        .await
        .expect("create pod");
        expected.push((ns.to_owned(), name, cdn));
    }
    let in_default = placed(&client, "default", "test=seed-000", 38, WAIT).await;
    let in_other = placed(&client, &other, "test=seed-000", 12, WAIT).await;
    for (ns, name, cdn) in expected {
        let node = if ns == "default" {
            &in_default[&name]
        } else {
            &in_other[&name]
        };
        if cdn {
            assert_eq!(node, "node2", "cdn pod {ns}/{name}");
        } else {
            assert_ne!(node, "node2", "pod {ns}/{name} is not entitled to node2");
        }
    }
}

#[tokio::test]
async fn seed_000_a_wildcard_toleration_stays_off_node2_and_node_name_node2_is_denied() {
    let _shared = NODE4_CPU.read().await;
    let client = berth().cluster.client().await;
    policy("cdn.yaml");
    opt_in(
        &client,
        "default",
        "cdn",
        &pod("probe", "example/cdn-uploader:1.0").build(),
        WAIT,
    )
    .await;
    cdn_pool_on_node2(&client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..8 {
        let tolerant = pod(&format!("tolerant-{i}"), "nginx")
            .labels(json!({"test": "wildcard"}))
            .spec(json!({"tolerations": [{"operator": "Exists"}]}))
            .build();
        pods.create(&PostParams::default(), &tolerant)
            .await
            .expect("create");
    }
    let nodes = placed(&client, "default", "test=wildcard", 8, WAIT).await;
    assert!(nodes.values().all(|n| n != "node2"), "{nodes:?}");

    let pinned = pod("pinned", "nginx")
        .spec(json!({"nodeName": "node2"}))
        .build();
    let error = pods
        .create(&PostParams::default(), &pinned)
        .await
        .expect_err("denied");
    assert!(
        error
            .to_string()
            .contains("spec.nodeName node2 is in dedicated pool cdn"),
        "{error}"
    );
}

#[tokio::test]
async fn seed_000_a_daemonset_runs_on_all_four_nodes_including_node2() {
    let _shared = NODE4_CPU.read().await;
    let client = berth().cluster.client().await;
    policy("cdn.yaml");
    cdn_pool_on_node2(&client).await;
    // The example policy takes DaemonSets of the platform's namespaces only.
    berth().cluster.kubectl(&["create", "namespace", "logging"]);
    let agent = format!("agent-{}", std::process::id());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "logging");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": agent},
        "spec": {"selector": {"matchLabels": {"app": agent}},
                 "template": {"metadata": {"labels": {"app": agent}},
                              "spec": {"containers": [{"name": "a", "image": "fluent-bit:3"}]}}}
    }))
    .unwrap();
    daemonsets
        .create(&PostParams::default(), &ds)
        .await
        .expect("create daemonset");
    let nodes = placed(&client, "logging", &format!("app={agent}"), 4, WAIT).await;
    let mut on: Vec<&String> = nodes.values().collect();
    on.sort();
    assert_eq!(on, ["node1", "node2", "node3", "node4"]);

    // A tenant's DaemonSet is not one of them: it stays off node2.
    let tenant_ns = fresh_namespace(&client, "tenant-agents").await;
    let theirs: Api<DaemonSet> = Api::namespaced(client.clone(), &tenant_ns);
    theirs
        .create(&PostParams::default(), &ds)
        .await
        .expect("create daemonset");
    // The DaemonSet controller has made every pod it means to: three, none for
    // node2 (a fourth pod, not yet bound, would not show in the bound ones).
    let desired = support::eventually("the tenant's DaemonSet settled", WAIT, || async {
        support::daemonset_made_all(&theirs.get(&agent).await.ok()?)
    })
    .await;
    assert_eq!(desired, 3, "one pod per node but the pool's");
    let nodes = placed(&client, &tenant_ns, &format!("app={agent}"), 3, WAIT).await;
    assert!(!nodes.values().any(|n| n == "node2"), "{nodes:?}");
}

/// The CPU of `node` in millicores that no pod bound to it requests, as the
/// scheduler counts it: allocatable, less each pod's containers (or its largest
/// init container, if larger) while the pod has not finished.
async fn free_cpu_millis(client: &Client, node: &str) -> i64 {
    let millis = |q: Option<&Quantity>| -> i64 {
        let text = q.map_or("0", |q| q.0.as_str());
        match text.strip_suffix('m') {
            Some(m) => m.parse().expect("millicores"),
            None => (text.parse::<f64>().expect("cores") * 1000.0) as i64,
        }
    };
    let cpu = |containers: &[Container]| -> Vec<i64> {
        containers
            .iter()
            .map(|c| {
                millis(
                    c.resources
                        .as_ref()
                        .and_then(|r| r.requests.as_ref()?.get("cpu")),
                )
            })
            .collect()
    };
    let allocatable = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .expect("the node")
        .status
        .and_then(|s| s.allocatable)
        .expect("allocatable");
    let on_node = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("the node's pods");
    let requested: i64 = on_node
        .items
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| p.spec.as_ref())
        .map(|spec| {
            let main: i64 = cpu(&spec.containers).iter().sum();
            let init = cpu(spec.init_containers.as_deref().unwrap_or_default());
            main.max(init.into_iter().max().unwrap_or(0))
        })
        .sum();
    millis(allocatable.get("cpu")) - requested
}

#[tokio::test]
async fn seed_000_preferred_placement_uses_the_pool_while_it_has_room() {
    let _alone = NODE4_CPU.write().await;
    let client = berth().cluster.client().await;
    berth().cluster.apply_policies(&[fixtures::policy(
        "spill",
        json!({"images": ["*spill*"], "pool": {"nodeNames": ["node4"], "dedicated": false,
            "placement": "Preferred", "weight": 100}}),
    )]);
    let ns = fresh_namespace(&client, "spill").await;
    opt_in(
        &client,
        &ns,
        "spill",
        &pod("probe", "example/spill-job:1").build(),
        WAIT,
    )
    .await;
    node_label(&client, "node4", names::POOL_LABEL, "spill").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut nodes = Vec::new();
    // Two fifths of what node4 has free: two fit, the third does not. (Other
    // tests' pods stay on node4, 100m each.)
    let size = free_cpu_millis(&client, "node4").await * 2 / 5;
    assert!(
        size >= 1000,
        "node4 has {size}m of CPU for each of three pods"
    );
    for i in 0..3 {
        let big = fixtures::pod(&format!("big-{i}"))
            .image("example/spill-job:1")
            .cpu(&format!("{size}m"))
            .build();
        pods.create(&PostParams::default(), &big)
            .await
            .expect("create");
        let bound = wait_for(&pods, &format!("big-{i}"), is_bound, WAIT)
            .await
            .unwrap();
        nodes.push(bound.spec.unwrap().node_name.unwrap());
    }
    assert_eq!(nodes[..2], ["node4", "node4"], "{nodes:?}");
    assert_ne!(
        nodes[2], "node4",
        "the pool is full, so the third spills over: {nodes:?}"
    );
}

#[tokio::test]
async fn sidecar_b_pods_wait_for_a_and_follow_it_when_it_scales_out() {
    let _shared = NODE4_CPU.read().await;
    let client = berth().cluster.client().await;
    policy("sidecar.yaml");
    let ns = fresh_namespace(&client, "sidecar").await;
    opt_in(
        &client,
        &ns,
        "b-beside-a",
        &pod("probe", "busybox").labels(json!({"app": "b"})).build(),
        WAIT,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    pods.create(
        &PostParams::default(),
        &pod("b-0", "busybox").labels(json!({"app": "b"})).build(),
    )
    .await
    .unwrap();
    // The scheduler's own word that B fits nowhere while no A runs.
    let unschedulable = |pod: Option<&Pod>| {
        pod.and_then(|p| p.status.as_ref()?.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
    };
    wait_for(&pods, "b-0", unschedulable, WAIT).await;

    let on = |node: &str| json!({"nodeSelector": {"kubernetes.io/hostname": node}});
    pods.create(
        &PostParams::default(),
        &pod("a-0", "nginx")
            .labels(json!({"app": "a"}))
            .spec(on("node1"))
            .build(),
    )
    .await
    .unwrap();
    let b0 = wait_for(&pods, "b-0", is_bound, WAIT).await.unwrap();
    assert_eq!(b0.spec.unwrap().node_name.as_deref(), Some("node1"));

    pods.create(
        &PostParams::default(),
        &pod("a-1", "nginx")
            .labels(json!({"app": "a"}))
            .spec(on("node3"))
            .build(),
    )
    .await
    .unwrap();
    node_label(&client, "node3", &names::anchor_label("b-beside-a"), "true").await;

    // Which of node1 and node3 the scheduler picks is its own scoring; what berth
    // decides is where B may go. Pinned to node3, where A now runs, B is placed;
    // pinned to node4, where no A runs, it waits.
    let b = |name: &str, extra: Value| {
        pod(name, "busybox")
            .labels(json!({"app": "b"}))
            .spec(extra)
            .build()
    };
    pods.create(&PostParams::default(), &b("b-node3", on("node3")))
        .await
        .unwrap();
    let followed = wait_for(&pods, "b-node3", is_bound, WAIT).await.unwrap();
    assert_eq!(
        followed.spec.unwrap().node_name.as_deref(),
        Some("node3"),
        "B follows A to node3"
    );
    pods.create(&PostParams::default(), &b("b-node4", on("node4")))
        .await
        .unwrap();
    for i in 1..7 {
        pods.create(&PostParams::default(), &b(&format!("b-{i}"), json!({})))
            .await
            .unwrap();
    }
    // b-0, b-node3 and six more: every one beside an A.
    let b_nodes = placed(&client, &ns, "app=b", 8, WAIT).await;
    assert!(
        b_nodes.values().all(|n| n == "node1" || n == "node3"),
        "{b_nodes:?}"
    );
    let lonely = pods.get("b-node4").await.unwrap();
    assert!(
        lonely.spec.unwrap().node_name.is_none(),
        "B was placed on node4, where no A runs"
    );
}

#[tokio::test]
async fn gpu_and_nvme_labels_drive_placement() {
    let _shared = NODE4_CPU.read().await;
    let client = berth().cluster.client().await;
    policy("gpu.yaml");
    let nodes: Api<Node> = Api::all(client.clone());
    let label = |labels: Value| json!({"metadata": {"labels": labels}});
    nodes
        .patch(
            "node3",
            &PatchParams::default(),
            &Patch::Merge(&label(json!({"nvidia.com/gpu.product": "A100"}))),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(&label(
                json!({"nvidia.com/gpu.product": "H100", "example.com/nvme": "true"}),
            )),
        )
        .await
        .unwrap();
    let ns = fresh_namespace(&client, "gpu").await;
    opt_in(
        &client,
        &ns,
        "gpu",
        &pod("probe", "nvcr.io/nvidia/cuda:12.4.0-base")
            .labels(json!({"app": "train"}))
            .build(),
        WAIT,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..3 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("train-{i}"), "nvcr.io/nvidia/cuda:12.4.0-base")
                .labels(json!({"app": "train"}))
                .build(),
        )
        .await
        .unwrap();
    }
    let placed = placed(&client, &ns, "app=train", 3, WAIT).await;
    assert!(
        placed.values().all(|n| n == "node1"),
        "GPU pods prefer the NVMe node: {placed:?}"
    );
    pods.create(
        &PostParams::default(),
        &pod("web", "nginx").labels(json!({"app": "web"})).build(),
    )
    .await
    .unwrap();
    // A pod the policy does not cover is left as written, and placed.
    let web = wait_for(&pods, "web", is_bound, WAIT).await.unwrap();
    assert!(
        web.metadata.annotations.is_none() && web.spec.unwrap().affinity.is_none(),
        "berth changed a pod no policy covers"
    );
}

#[tokio::test]
async fn a_namespace_scheduler_annotation_routes_its_pods() {
    let _shared = NODE4_CPU.read().await;
    let client = berth().cluster.client().await;
    let ns = fresh_namespace(&client, "batch").await;
    annotate(&client, &ns, names::SCHEDULER_ANNOTATION, "batch-scheduler").await;
    wait_admitted(
        &client,
        &ns,
        &pod("probe", "spark:3").build(),
        "berth routes pods in the namespace",
        |p| p.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()) == Some("batch-scheduler"),
        WAIT,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let created = pods
        .create(&PostParams::default(), &pod("job", "spark:3").build())
        .await
        .unwrap();
    assert_eq!(
        created.spec.unwrap().scheduler_name.as_deref(),
        Some("batch-scheduler")
    );
    // A pod for the default scheduler, created after, in a namespace berth does
    // not route. The scheduler sees pods in the order they were created and takes
    // the older of two equal-priority pods first: once it has bound this one, it
    // would have decided on `job` had it been its own, and the cluster's record
    // shows it did not (no node, no PodScheduled condition).
    let other = fresh_namespace(&client, "unrouted").await;
    let others: Api<Pod> = Api::namespaced(client.clone(), &other);
    others
        .create(&PostParams::default(), &pod("after", "spark:3").build())
        .await
        .unwrap();
    wait_for(&others, "after", is_bound, WAIT).await;
    let later = pods.get("job").await.unwrap();
    let status = later.status.unwrap_or_default();
    assert!(
        later.spec.unwrap().node_name.is_none() && status.conditions.is_none(),
        "the default scheduler left it to batch-scheduler: {status:?}"
    );
}

/// kubectl finds berth installed as `kubectl-berth`; `kubectl berth explain
/// deployment` says where the Deployment's pods go and why before reading where
/// each is, and what holds a pending one (the scheduler's own word, from the pod).
#[tokio::test]
async fn kubectl_berth_explains_a_deployment_and_what_holds_its_pending_pod() {
    let _shared = NODE4_CPU.read().await;
    let cluster = &berth().cluster;
    let client = cluster.client().await;
    policy("cdn.yaml");
    let ns = fresh_namespace(&client, "plugin").await;
    opt_in(
        &client,
        &ns,
        "cdn",
        &pod("probe", "example/cdn-edge:1").build(),
        WAIT,
    )
    .await;
    cdn_pool_on_node2(&client).await;
    let deployment = |name: &str, replicas: u32, image: &str, spec: Value| {
        let mut template = json!({"containers": [{"name": "c", "image": image}]});
        template
            .as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": template}}})
    };
    let manifests = [
        deployment("edge", 2, "example/cdn-edge:1", json!({})),
        deployment(
            "stuck",
            1,
            "nginx:1.27",
            json!({"nodeSelector": {"disk": "none"}}),
        ),
    ];
    for manifest in manifests {
        let out =
            support::kubectl_with_input(&cluster.dir, &["apply", "-f", "-"], &manifest.to_string());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let edge = placed(&client, &ns, "app=edge", 2, WAIT).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (stuck, why) = support::eventually("the scheduler's word on stuck", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=stuck"))
            .await
            .ok()?;
        let pod = list.items.into_iter().next()?;
        let condition =
            pod.status?.conditions?.into_iter().find(|c| {
                c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
            })?;
        Some((pod.metadata.name?, condition.message?))
    })
    .await;

    // kubectl runs plugins found on PATH, named kubectl-NAME; KUBECONFIG names
    // this cluster (kubectl passes its environment on to the plugin).
    let plugins = cluster.dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let plugin = plugins.join("kubectl-berth");
    if !plugin.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_berth"), &plugin).unwrap();
    }
    let bin = support::cluster_script("build", &[]).trim().to_owned();
    let path = format!("{}:{}", plugins.display(), std::env::var("PATH").unwrap());
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new(std::path::Path::new(&bin).join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = kubectl(&["plugin", "list"]);
    assert!(listed.contains(plugin.to_str().unwrap()), "{listed}");
    let help = kubectl(&["berth", "--help"]);
    assert!(help.contains("Usage: kubectl berth <COMMAND>"), "{help}");

    let text = kubectl(&["berth", "explain", "deployment", "edge", "-n", &ns]);
    let mut expected = vec![
        format!("Pod edge-* (Deployment edge) in namespace {ns}"),
        "image docker.io/example/cdn-edge:1 of container c matches *cdn*".to_owned(),
        "The pod may land on: node2.".to_owned(),
        "Its pods now (2):".to_owned(),
    ];
    for (pod, node) in &edge {
        expected.push(format!("  {pod}\n    Now: bound to node {node}.\n"));
    }
    for line in expected {
        assert!(text.contains(&line), "missing {line:?} in:\n{text}");
    }
    let text = kubectl(&["berth", "explain", "deploy", "stuck", "-n", &ns]);
    let line = format!("  {stuck}\n    Now: not scheduled yet; the scheduler says: {why}");
    assert!(text.contains(&line), "missing {line:?} in:\n{text}");
}
