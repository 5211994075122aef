#![cfg(feature = "e2e")]
//! Seed 000 as people run it: the real Tekton Pipelines controller (built from its
//! Go module, installed from its own `config/`, `tests/cluster/tekton-up`) creates
//! the task pods and the affinity assistant, and berth routes them with
//! `policies/cdn.yaml` as shipped. kwok finishes the steps, so runs succeed.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::{Berth, Nodes, eventually, fresh_namespace, has_applied, opt_in, test_pod};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);

/// berth with the shipped cdn policy, and Tekton, on one cluster.
fn berth() -> &'static Berth {
    static READY: OnceLock<()> = OnceLock::new();
    let berth = Berth::shared(NODES);
    READY.get_or_init(|| {
        let dir = berth.cluster.dir.to_string_lossy().into_owned();
        support::cluster_script("tekton-up", &[&dir]);
        let policy = support::repo_root().join("policies/cdn.yaml");
        berth
            .cluster
            .kubectl_ok(&["apply", "-f", policy.to_str().unwrap()]);
    });
    berth
}

/// A namespace that opts into cdn, once berth's caches know it.
async fn cdn_namespace(client: &Client, purpose: &str) -> String {
    let ns = fresh_namespace(client, purpose).await;
    let probe = test_pod("probe", json!({}), json!({}));
    let mut probe = probe;
    probe.spec.as_mut().unwrap().containers[0].image = Some("example.com/cdn-uploader:1".into());
    opt_in(client, &ns, "cdn", &probe, WAIT).await;
    ns
}

fn apply(objects: &[Value]) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = std::env::temp_dir().join(format!("berth-tekton-{}-{n}.json", std::process::id()));
    std::fs::write(&file, list.to_string()).unwrap();
    berth()
        .cluster
        .kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
}

fn task(name: &str, image: &str, workspace: bool) -> Value {
    let mut spec = json!({"steps": [{"name": name, "image": image, "command": [name]}]});
    if workspace {
        spec["workspaces"] = json!([{"name": "source"}]);
    }
    spec
}

/// The condition `Succeeded` of a TaskRun or PipelineRun: its status and reason.
fn succeeded(ns: &str, kind: &str, name: &str) -> Option<(String, String)> {
    let out = berth().cluster.kubectl(&[
        "get",
        kind,
        name,
        "-n",
        ns,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Succeeded")].status} {.status.conditions[?(@.type=="Succeeded")].reason}"#,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (status, reason) = text.split_once(' ')?;
    Some((status.to_owned(), reason.to_owned()))
}

async fn wait_succeeded(ns: &str, kind: &str, name: &str) {
    let outcome = eventually(&format!("{kind} {ns}/{name} finished"), WAIT, || async {
        succeeded(ns, kind, name).filter(|(status, _)| status != "Unknown")
    })
    .await;
    assert_eq!(outcome.0, "True", "{kind} {name}: {outcome:?}");
}

/// The pod of TaskRun `taskrun`.
async fn task_pod(pods: &Api<Pod>, taskrun: &str) -> Pod {
    let selector = format!("tekton.dev/taskRun={taskrun}");
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap();
    listed.items.into_iter().next().expect("the TaskRun's pod")
}

fn node_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

#[tokio::test]
async fn taskruns_of_cdn_images_run_on_the_pool_and_others_stay_off() {
    let client = berth().cluster.client().await;
    let ns = cdn_namespace(&client, "taskruns").await;
    let other = fresh_namespace(&client, "taskruns-other").await;
    let run = |ns: &str, name: &str, image: &str| {
        json!({"apiVersion": "tekton.dev/v1", "kind": "TaskRun",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"taskSpec": task(name, image, false)}})
    };
    apply(&[
        run(&ns, "upload", "example.com/cdn-uploader:1.0"),
        run(&ns, "build", "golang:1.26"),
        run(&other, "upload", "example.com/cdn-uploader:1.0"),
    ]);
    for (namespace, name) in [(&ns, "upload"), (&ns, "build"), (&other, "upload")] {
        wait_succeeded(namespace, "taskrun", name).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let upload = task_pod(&pods, "upload").await;
    assert_eq!(node_of(&upload), "node2");
    assert!(has_applied(&upload, "cdn"));
    assert_ne!(node_of(&task_pod(&pods, "build").await), "node2");
    let elsewhere: Api<Pod> = Api::namespaced(client, &other);
    assert_ne!(node_of(&task_pod(&elsewhere, "upload").await), "node2");
}

/// A PipelineRun of the seed's CI shape: build, then a cdn upload, sharing a
/// workspace on a claim, with Tekton's default `coschedule: workspaces` (an
/// affinity assistant, and every task pod required beside it).
fn publish(ns: &str, name: &str, labels: Value) -> Vec<Value> {
    let volume = format!("{ns}-{name}");
    vec![
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "manual", "hostPath": {"path": format!("/tmp/{volume}")}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}}}),
        json!({"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "workspaces": [{"name": "source", "persistentVolumeClaim": {"claimName": name}}],
                "pipelineSpec": {"workspaces": [{"name": "source"}], "tasks": [
                    {"name": "build", "workspaces": [{"name": "source"}],
                        "taskSpec": task("build", "golang:1.26", true)},
                    {"name": "upload", "runAfter": ["build"], "workspaces": [{"name": "source"}],
                        "taskSpec": task("upload", "example.com/cdn-uploader:1.0", true)}]}}}),
    ]
}

#[tokio::test]
async fn a_pipeline_run_sharing_a_workspace_runs_its_cdn_upload_on_the_pool() {
    let client = berth().cluster.client().await;
    let ns = cdn_namespace(&client, "publish").await;
    apply(&publish(
        &ns,
        "publish",
        json!({"cdn.example.com/pipeline": "true"}),
    ));
    wait_succeeded(&ns, "pipelinerun", "publish").await;
    // The whole run went to the pool with its assistant: the build beside the
    // upload, on node2, as coscheduled says.
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    for task in ["publish-build", "publish-upload"] {
        let pod = task_pod(&pods, task).await;
        assert_eq!(node_of(&pod), "node2", "{task}");
        assert!(has_applied(&pod, "cdn"), "{task}");
    }
}

#[tokio::test]
async fn without_coscheduled_the_upload_cannot_sit_beside_its_assistant_and_the_scheduler_says_so()
{
    let client = berth().cluster.client().await;
    let ns = cdn_namespace(&client, "unrouted").await;
    apply(&publish(&ns, "unrouted", json!({})));
    wait_succeeded_task(&ns, "unrouted-build").await;
    // The assistant is off the pool (its image is no cdn image); the upload must
    // be on the pool and beside it: the scheduler finds no node.
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let message = eventually("the upload reported Unschedulable", WAIT, || async {
        let pod = pods
            .list(&ListParams::default().labels("tekton.dev/taskRun=unrouted-upload"))
            .await
            .ok()?
            .items
            .into_iter()
            .next()?;
        let condition = pod
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        (condition.reason.as_deref() == Some("Unschedulable")).then_some(())?;
        condition.message
    })
    .await;
    // The scheduler's own record of why: the pool's node fails the pod affinity.
    assert!(
        message.contains("didn't match pod affinity rules"),
        "{message}"
    );
    // `berth explain pod` tells the truth: no node, because of the pod's own pod
    // affinity beside the assistant, and the admission warning says what to do.
    let upload = task_pod(&pods, "unrouted-upload").await;
    let kubeconfig = berth().cluster.kubeconfig();
    let out = berth().run(&[
        "explain",
        "pod",
        upload.metadata.name.as_deref().unwrap(),
        "-n",
        &ns,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("node2: no, its own pod affinity needs a pod matching")
            && text.contains("affinity-assistant"),
        "{text}"
    );
    assert!(
        text.contains("its own pod (anti-)affinity leaves none; it would stay Pending"),
        "{text}"
    );
    assert!(
        text.contains("pool cdn: the pod must sit beside pods that may run elsewhere"),
        "{text}"
    );
    // And berth's controller says so on the pod, where Tekton got the warning.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(berth().cluster.client().await, &ns);
    let upload_name = upload.metadata.name.clone().unwrap();
    let note = eventually("berth's RoutedApartFromGroup Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=RoutedApartFromGroup"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(upload_name.as_str())
            })
            .and_then(|e| e.note)
    })
    .await;
    assert!(note.contains("berth routes it to pool cdn"), "{note}");
    berth().cluster.kubectl_ok(&[
        "delete",
        "pipelinerun",
        "unrouted",
        "-n",
        &ns,
        "--wait=false",
    ]);
}

async fn wait_succeeded_task(ns: &str, name: &str) {
    wait_succeeded(ns, "taskrun", name).await;
}
