//! `berth explain pod NAME -n NS` and `berth explain deployment NAME -n NS` (and
//! the other workload kinds): the offline explanation, run on the pod (or the pod
//! the workload's template makes), its namespace, the policies and the nodes as
//! the cluster has them now, followed by where pods stand: bound, held by berth's
//! gate (and behind which pod), or waiting for the scheduler (with the
//! scheduler's last word).

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Args;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod, Taint};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::offline::{Ending, print};
use super::workload::{Kind, Subject};
use crate::names::{AVOID_GATE, GROUP_GATES};
use crate::objects::{MetaOnly, NamespaceMeta, NodeObject, PodObject, PolicyObject};
use crate::objects::{NodeIndex, NodeInfo};
use crate::placement::exclusion::{self, ExclusionPod, Hold};
use crate::placement::explain::explain;
use crate::placement::interpod::{Bound, Neighbours};
use crate::placement::namespace::{NamespaceIndex, NamespaceInfo, namespace_index};
use crate::placement::rooms::{Rooms, node_rooms};
use crate::placement::{Input, Requester, decide};
use crate::policy::compile::{Labels, PolicyCompiler};
use crate::policy::{OptIn, PolicySet};

/// An object in the cluster to explain.
#[derive(Debug, Args)]
pub struct Target {
    /// Its name.
    pub name: String,
    /// Its namespace.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    /// Kubeconfig to use; without it, KUBECONFIG, ~/.kube/config or the in-cluster
    /// service account, as kubectl would.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// `berth explain pod NAME -n NS` (`kind` None) or `berth explain KIND NAME -n NS`.
/// Reads only; what exists was admitted, so the exit code is 0 whatever the
/// decision says.
pub fn explain_live(kind: Option<Kind>, target: &Target) -> Result<Ending, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let text = runtime.block_on(async {
        let client = super::client::kube_client(target.kubeconfig.as_deref()).await?;
        match kind {
            None => explain_pod(&client, target).await,
            Some(kind) => explain_workload(&client, kind, target).await,
        }
    })?;
    print(&text);
    Ok(Ending::Done)
}

/// What the cluster says around one namespace, read once, leniently: a pod,
/// policy or node berth cannot fully read never stops the explanation.
struct Scene {
    namespace: NamespaceInfo,
    policies: PolicySet,
    nodes: NodeIndex,
    /// The nodes with the room left on each, as the controller predicts fit.
    rooms: Rooms,
    /// Each namespace, for opt-in and for pod affinity's `namespaceSelector`.
    namespaces: NamespaceIndex,
    pods: Vec<PodObject>,
}

impl Scene {
    /// The explanation of the decision on `pod`, as the webhook would make it.
    fn explain(&self, pod: &Value, title: &str, requester: Requester) -> String {
        let input = Input {
            pod,
            namespace: &self.namespace,
            policies: &self.policies,
            nodes: Some(&self.nodes),
            requester,
            groups: Default::default(),
        };
        let decision = decide(&input);
        // The pods bound now, other than this one, for its own pod affinity.
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        // A pod without labels still counts (`{}` and DoesNotExist select it).
        let unlabelled = Labels::new();
        let neighbours = Neighbours {
            pods: self
                .pods
                .iter()
                .filter(|p| !p.is_terminated())
                .filter(|p| {
                    p.metadata.name.as_deref() != Some(name)
                        || p.metadata.namespace.as_deref() != Some(self.namespace.name.as_str())
                })
                .filter_map(|p| {
                    Some(Bound {
                        namespace: p.metadata.namespace.as_deref()?,
                        labels: p.metadata.labels.as_ref().unwrap_or(&unlabelled),
                        node: p.node_name()?,
                    })
                })
                .collect(),
            namespace_labels: self
                .namespaces
                .iter()
                .map(|(n, ns)| (n.as_str(), &ns.labels))
                .collect(),
        };
        explain(&input, title, &decision, Some(&neighbours))
    }

    /// Where `pod` stands now, in words, and (for a group gate) what it waits
    /// for; each line prefixed with `indent`.
    fn standing(&self, pod: &PodObject, said: Option<&(String, String)>, indent: &str) -> String {
        let now = standing(
            pod,
            &self.pods,
            &self.rooms,
            &self.policies,
            &self.namespaces,
        );
        let mut text = format!("{indent}Now: {now}\n");
        if let Some(why) = group_standing(pod, said) {
            text.push_str(&format!("{indent}Waiting: {why}\n"));
        }
        text
    }
}

/// A taint from its raw JSON; `timeAdded` is not read.
fn taint(raw: &Value) -> Option<Taint> {
    let field = |k: &str| raw.get(k).and_then(Value::as_str).map(str::to_owned);
    Some(Taint {
        key: field("key")?,
        value: field("value"),
        effect: field("effect")?,
        time_added: None,
    })
}

/// Whether the pod's controller is a DaemonSet that exists in its namespace: then
/// the DaemonSet controller made it.
async fn requester(client: &Client, pod: &PodObject) -> Requester {
    let namespace = pod.namespace().unwrap_or_default();
    let Some(owner) = crate::placement::pod::daemonset_owner(pod.owner_references()) else {
        return Requester::Other;
    };
    let api: Api<MetaOnly<DaemonSet>> = Api::namespaced(client.clone(), &namespace);
    match api.get_opt(&owner.name).await {
        Ok(Some(ds)) if ds.metadata.uid.as_deref() == Some(owner.uid.as_str()) => {
            Requester::DaemonSetController
        }
        _ => Requester::Other,
    }
}

/// One object as raw JSON, without its `metadata.managedFields`.
async fn get_raw(client: &Client, path: String, what: &str, name: &str) -> Result<Value, String> {
    let request = kube::core::Request::new(path)
        .get(name, &Default::default())
        .map_err(|e| format!("{what}: {e}"))?;
    let text = match client.request_text(request).await {
        Ok(text) => text,
        Err(kube::Error::Api(e)) if e.code == 404 => return Err(format!("{what} not found")),
        Err(e) => return Err(format!("{what}: {e}")),
    };
    let mut object: Value = serde_json::from_str(&text).map_err(|e| format!("{what}: {e}"))?;
    // berth reads nothing of it, and it is most of an object's bytes.
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    Ok(object)
}

async fn read_scene(client: &Client, namespace: &str) -> Result<Scene, String> {
    let list = ListParams::default();
    let namespaces = Api::<NamespaceMeta>::all(client.clone())
        .list(&list)
        .await
        .map_err(|e| format!("listing namespaces: {e}"))?
        .items;
    let this = namespaces
        .iter()
        .find(|ns| ns.metadata.name.as_deref() == Some(namespace))
        .map(|ns| NamespaceInfo::from_meta(&ns.metadata))
        .ok_or_else(|| format!("namespace {namespace} not found"))?;
    let policies = Api::<PolicyObject>::all(client.clone())
        .list(&list)
        .await
        .map_err(|e| format!("listing PlacementPolicies (is berth's CRD installed?): {e}"))?
        .items;
    // Deleted policies no longer apply, exactly as in the webhook and controller.
    let policies = PolicyCompiler::default()
        .compile(policies.iter().map(PolicyObject::source))
        .set;
    let policies = std::sync::Arc::unwrap_or_clone(policies);
    let node_objects = Api::<NodeObject>::all(client.clone())
        .list(&list)
        .await
        .map_err(|e| format!("listing nodes: {e}"))?
        .items;
    let nodes = node_objects
        .iter()
        .map(|n| {
            let info = NodeInfo {
                labels: n.labels().clone(),
                taints: n.spec.taints.iter().filter_map(taint).collect(),
            };
            (n.name_any(), info)
        })
        .collect();
    let pods = Api::<PodObject>::all(client.clone())
        .list(&list)
        .await
        .map_err(|e| format!("listing pods: {e}"))?
        .items;
    let node_objects: Vec<&NodeObject> = node_objects.iter().collect();
    let rooms = node_rooms(&node_objects, &pods);
    Ok(Scene {
        namespace: this,
        policies,
        nodes,
        rooms,
        namespaces: namespace_index(namespaces.iter().map(|ns| &ns.metadata)),
        pods,
    })
}

/// The newest Event berth's controller published about `pod` (why a group gate
/// still holds it): the explanation says the same as the Event. Events that
/// cannot be listed leave it unsaid.
async fn last_word(client: &Client, pod: &PodObject) -> Option<(String, String)> {
    let uid = pod.metadata.uid.as_deref()?;
    let namespace = pod.metadata.namespace.as_deref()?;
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    let events = api.list(&params).await.ok()?.items;
    events
        .into_iter()
        .filter(|e| e.reporting_component.as_deref() == Some("berth"))
        .max_by_key(|e| {
            let series = e.series.as_ref().and_then(|s| s.last_observed_time.clone());
            series.map(|t| t.0).or(e.event_time.as_ref().map(|t| t.0))
        })
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
}

async fn explain_pod(client: &Client, target: &Target) -> Result<String, String> {
    let what = format!("pod {}/{}", target.namespace, target.name);
    let path = <Pod as kube::Resource>::url_path(&(), Some(&target.namespace));
    let raw = get_raw(client, path, &what, &target.name).await?;
    let pod: PodObject = serde_json::from_value(raw.clone()).map_err(|e| format!("{what}: {e}"))?;
    let scene = read_scene(client, &target.namespace).await?;
    let said = last_word(client, &pod).await;
    let mut text = scene.explain(&raw, &target.name, requester(client, &pod).await);
    text.push('\n');
    text.push_str(&scene.standing(&pod, said.as_ref(), ""));
    Ok(text)
}

/// The pod `kind` NAME's template makes, explained, then each of its pods now:
/// where it runs, or what holds it.
async fn explain_workload(client: &Client, kind: Kind, target: &Target) -> Result<String, String> {
    let what = format!("{} {}/{}", kind.name(), target.namespace, target.name);
    let raw = get_raw(
        client,
        kind.url_path(&target.namespace),
        &what,
        &target.name,
    )
    .await?;
    let uid = raw
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let subject = Subject::from_document(raw).map_err(|e| format!("{what} {e}"))?;
    let scene = read_scene(client, &target.namespace).await?;
    let requester = if kind == Kind::DaemonSet {
        Requester::DaemonSetController
    } else {
        Requester::Other
    };
    let mut text = scene.explain(&subject.pod, &subject.title, requester);
    let owners = owners_in(client, &target.namespace).await?;
    let mut pods: Vec<&PodObject> = scene
        .pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(target.namespace.as_str()))
        .filter(|p| made_by(p, &uid, &owners))
        .collect();
    pods.sort_by_key(|p| p.name_any());
    if pods.is_empty() {
        text.push_str(&format!(
            "\nNow: {} {} has no pods.\n",
            kind.name(),
            target.name
        ));
        return Ok(text);
    }
    text.push_str(&format!("\nIts pods now ({}):\n", pods.len()));
    for pod in pods {
        let said = last_word(client, pod).await;
        text.push_str(&format!("  {}\n", pod.name_any()));
        text.push_str(&scene.standing(pod, said.as_ref(), "    "));
    }
    Ok(text)
}

/// The controller owner (uid) of each ReplicaSet and Job in `namespace`: the
/// middle link from a Deployment or CronJob to its pods.
async fn owners_in(client: &Client, namespace: &str) -> Result<HashMap<String, String>, String> {
    let list = ListParams::default();
    let mut owners = HashMap::new();
    let replica_sets = Api::<MetaOnly<ReplicaSet>>::namespaced(client.clone(), namespace)
        .list(&list)
        .await
        .map_err(|e| format!("listing ReplicaSets: {e}"))?;
    let jobs = Api::<MetaOnly<Job>>::namespaced(client.clone(), namespace)
        .list(&list)
        .await
        .map_err(|e| format!("listing Jobs: {e}"))?;
    let metas = replica_sets
        .items
        .iter()
        .map(|o| &o.metadata)
        .chain(jobs.items.iter().map(|o| &o.metadata));
    for meta in metas {
        if let (Some(uid), Some(owner)) = (&meta.uid, controller_uid(meta)) {
            owners.insert(uid.clone(), owner.to_owned());
        }
    }
    Ok(owners)
}

fn controller_uid(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Whether the workload with `uid` made `pod`: it is the pod's controller, or the
/// controller of the pod's controller (a Deployment's ReplicaSet, a CronJob's Job).
fn made_by(pod: &PodObject, uid: &str, owners: &HashMap<String, String>) -> bool {
    controller_uid(&pod.metadata)
        .is_some_and(|owner| owner == uid || owners.get(owner).is_some_and(|o| o == uid))
}

/// Why a group gate (`berth.io/gang`, `berth.io/rank`) still holds `pod`: berth's
/// controller's last word on it, or that it has said nothing yet.
fn group_standing(pod: &PodObject, said: Option<&(String, String)>) -> Option<String> {
    let gate = GROUP_GATES.into_iter().find(|g| pod.gate(g).is_some())?;
    Some(match said {
        Some((reason, message)) => format!("{reason}: {message}"),
        None => format!(
            "held by the scheduling gate {gate}; berth's controller has published no reason \
             yet. If that lasts, check that a berth controller runs and holds the Lease \
             berth-controller."
        ),
    })
}

/// Where `pod` stands now, in one sentence: the part of the explanation only a
/// live cluster can give.
fn standing(
    pod: &PodObject,
    pods: &[PodObject],
    rooms: &Rooms,
    policies: &PolicySet,
    opt_in: &dyn OptIn,
) -> String {
    if let Some(node) = pod.node_name() {
        return format!("bound to node {node}.");
    }
    let gates: Vec<&str> = pod
        .spec
        .scheduling_gates
        .iter()
        .map(|g| g.name.as_str())
        .collect();
    let group_gates: Vec<&str> = gates
        .iter()
        .copied()
        .filter(|g| GROUP_GATES.contains(g))
        .collect();
    let others: Vec<&str> = gates
        .iter()
        .copied()
        .filter(|g| *g != AVOID_GATE && !group_gates.contains(g))
        .collect();
    let mut out = String::new();
    if !group_gates.is_empty() {
        // The avoid gate goes last: the group gates hold the pod first.
        out.push_str(&format!(
            "held by the scheduling gate {}",
            group_gates.join(" and ")
        ));
    } else if gates.contains(&AVOID_GATE) {
        out.push_str(&held(pod, pods, rooms, policies, opt_in));
    } else if others.is_empty() {
        match pod.unscheduled_reason() {
            Some(why) => out.push_str(&format!("not scheduled yet; the scheduler says: {why}")),
            None => out.push_str("waiting for the scheduler"),
        }
    }
    if !others.is_empty() {
        if gates.len() > others.len() {
            while out.ends_with('.') {
                out.pop();
            }
            out.push_str(". Also ");
        }
        out.push_str(&format!(
            "held by scheduling gates berth does not own: {}",
            others.join(", ")
        ));
    }
    // The scheduler's messages end with a full stop of their own.
    if !out.ends_with('.') {
        out.push('.');
    }
    out
}

/// Why a pod with berth's gate is still held: the same plan the controller makes.
fn held(
    pod: &PodObject,
    pods: &[PodObject],
    rooms: &Rooms,
    policies: &PolicySet,
    opt_in: &dyn OptIn,
) -> String {
    let all: Vec<ExclusionPod> = pods.iter().filter_map(ExclusionPod::from_pod).collect();
    let plan = exclusion::plan(&all, policies, opt_in, &Default::default(), rooms);
    let is_this = |p: &ExclusionPod| {
        Some(p.namespace.as_str()) == pod.metadata.namespace.as_deref()
            && Some(p.name.as_str()) == pod.metadata.name.as_deref()
    };
    let waiting = plan.waiting.iter().find(|w| is_this(w.pod));
    match waiting.map(|w| &w.reason) {
        Some(Hold::Behind {
            pod: behind,
            policy,
        }) => {
            let mut text = format!(
                "held by the scheduling gate {AVOID_GATE}: it must avoid {}/{} (policy {policy}), \
                 which is released but not bound yet, and no nodes apart from it have room for \
                 this pod; berth's controller releases this pod once that one is bound",
                behind.namespace, behind.name
            );
            let blocker = pods.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(&behind.namespace)
                    && p.metadata.name.as_deref() == Some(&behind.name)
            });
            if let Some(why) = blocker.and_then(PodObject::unscheduled_reason) {
                text.push_str(&format!(
                    ". That pod is not scheduled; the scheduler says: {why}"
                ));
            }
            text
        }
        Some(Hold::NoNodeFree { policy }) => format!(
            "held by the scheduling gate {AVOID_GATE}: {}",
            exclusion::no_node_free(policy)
        ),
        Some(Hold::Unreadable) => format!(
            "held by the scheduling gate {AVOID_GATE}: {}",
            exclusion::unreadable()
        ),
        // Not possible with no unseen policies, but said plainly if it were.
        Some(Hold::PolicyNotSeen(policy)) => {
            format!("held by the scheduling gate {AVOID_GATE} until policy {policy} is known")
        }
        None => format!(
            "held by the scheduling gate {AVOID_GATE}, with nothing to wait for: berth's \
             controller releases it on its next pass. If it stays held, check that a berth \
             controller runs and holds the Lease berth-controller"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::opt_in::tests::Everyone;
    use crate::policy::PlacementPolicy;
    use serde_json::json;

    fn masters() -> PolicySet {
        let policy: PlacementPolicy = serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "masters"},
            "spec": {"podSelector": {"matchLabels": {"app": "m"}}, "avoid": {"matchLabels": {"app": "m"}}}}))
        .unwrap();
        PolicySet::compile([&policy]).0
    }

    fn pod(name: &str, gated: bool, node: Option<&str>, unschedulable: Option<&str>) -> PodObject {
        let gates = if gated {
            json!([{"name": AVOID_GATE}])
        } else {
            json!([])
        };
        let conditions = match unschedulable {
            Some(message) => json!([{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": message}]),
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "db", "labels": {"app": "m"},
                "annotations": {"berth.io/applied": "masters"},
                "creationTimestamp": format!("2026-01-01T00:00:0{}Z", &name[1..])},
            "spec": {"containers": [], "schedulingGates": gates, "nodeName": node},
            "status": {"conditions": conditions}}))
        .unwrap()
    }

    #[test]
    fn a_held_pod_names_the_pod_it_waits_for_and_why_that_one_is_not_placed() {
        let pods = vec![
            pod("m1", false, None, Some("0/3 nodes are available")),
            pod("m2", true, None, None),
        ];
        let text = standing(&pods[1], &pods, &Rooms::new(), &masters(), &Everyone);
        assert!(
            text.contains("it must avoid db/m1 (policy masters), which is released but not bound"),
            "{text}"
        );
        assert!(
            text.contains("the scheduler says: 0/3 nodes are available"),
            "{text}"
        );
        let text = standing(&pods[0], &pods, &Rooms::new(), &masters(), &Everyone);
        assert!(
            text.contains("not scheduled yet; the scheduler says: 0/3 nodes are available"),
            "{text}"
        );
    }

    #[test]
    fn bound_and_free_to_go_pods_say_so() {
        let pods = vec![
            pod("m1", false, Some("node7"), None),
            pod("m2", true, None, None),
        ];
        let set = masters();
        assert_eq!(
            standing(&pods[0], &pods, &Rooms::new(), &set, &Everyone),
            "bound to node node7."
        );
        let text = standing(&pods[1], &pods, &Rooms::new(), &set, &Everyone);
        assert!(text.contains("with nothing to wait for"), "{text}");
    }
}
