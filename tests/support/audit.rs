//! What the fault suite checks, read from the cluster's own record: the pods as
//! the apiserver stores them and every change to them in order (a watch), the
//! Nodes, the PlacementPolicies and the Namespaces.
//!
//! The rules are written out here from the contract (docs/contract.md) for the
//! shapes the suite uses (pools by node name or `matchLabels`, `avoid` and
//! `colocateWith` by `matchLabels`, opt-in by the `berth.io/policies` annotation),
//! not taken from berth's code: the audit must not share berth's mistakes.
//!
//! - **unentitled**: a pod bound to a dedicated pool node whose `berth.io/applied`
//!   does not name the pool's policy in a namespace that opts into it;
//! - **exclusion**: two pods on one node that must avoid each other: one admitted
//!   under an `avoid` policy (its `berth.io/applied` names it, its namespace opts
//!   in), the other matching the policy's `avoid` selector in a namespace the
//!   policy counts; a pair is berth's to keep apart when both were admitted by it
//!   (neither is a missed pod);
//! - **apart**: a pod admitted under a `colocateWith` policy bound to a node where
//!   no pod it must be beside runs;
//! - **missed**: a pod a policy in force applies to (namespace opt-in, images,
//!   `podSelector`) stored without the policy in `berth.io/applied`;
//! - **stuck**: a pod neither bound nor being deleted when the load is over and has
//!   had time to settle;
//! - **nodes**: berth's labels and taints on each Node against what the policies
//!   and the pods bound there say (pool label and taint of the oldest claiming
//!   policy, anchor labels `berth.runs.<policy>` where an anchor pod is bound,
//!   `berth.placed.<policy>` where a pod admitted under an `avoid` policy is), plus
//!   every policy `Ready` and none stuck in deletion.
//!
//! The exclusion, co-location and pool checks run at every binding the watch
//! shows, against the pods bound at that point of the cluster's history, so a pair
//! that shared a node for a moment and was deleted since is still found.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use berth::names::{self, APPLIED_ANNOTATION, POOL_LABEL, POOL_TAINT};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::load::LOAD_LABEL;

/// Where every node label of berth's starts (the pool, anchor and placed labels of
/// `berth::names`): a label there that the policies do not call for is wrong.
pub const BERTH_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/berth.";

type Labels = BTreeMap<String, String>;

/// A PlacementPolicy as far as the audit reads it.
#[derive(Debug, Clone)]
pub struct PolicyModel {
    pub name: String,
    pub created: String,
    pub images: Vec<String>,
    pub pod_selector: Option<Labels>,
    pub pool_nodes: BTreeSet<String>,
    pub pool_selector: Option<Labels>,
    pub dedicated: bool,
    pub effect: String,
    pub avoid: Option<Labels>,
    pub colocate: Option<Labels>,
    pub anchor_all: bool,
}

/// `matchLabels` of a LabelSelector; the audit reads no other kind.
fn match_labels(selector: &Value, what: &str) -> Labels {
    assert!(
        selector.get("matchExpressions").is_none(),
        "the audit reads only matchLabels selectors ({what})"
    );
    serde_json::from_value(selector.get("matchLabels").cloned().unwrap_or(Value::Null))
        .unwrap_or_default()
}

impl PolicyModel {
    pub fn from_json(policy: &Value) -> PolicyModel {
        let name = policy["metadata"]["name"].as_str().unwrap().to_owned();
        let spec = &policy["spec"];
        assert!(
            spec.get("namespaceSelector").is_none(),
            "the audit reads opt-in by annotation only ({name})"
        );
        let pool = spec.get("pool");
        // A pool selector that reads a label a node can set on itself takes in only
        // the nodes it has: the audit reads selectors whose every node matching is
        // in the pool, those on labels only an administrator sets and those of a
        // pool that trusts self-set labels.
        if let Some(selector) = pool.and_then(|p| p.get("nodeSelector")) {
            let trusts = pool.is_some_and(|p| p["trustSelfSetLabels"] == true);
            let restricted = match_labels(selector, &name)
                .keys()
                .all(|k| k.starts_with("node-restriction.kubernetes.io/"));
            assert!(
                trusts || restricted,
                "the audit reads pool selectors on node-restriction.kubernetes.io/ labels, or \
                 of a pool that trusts self-set labels ({name})"
            );
        }
        let selector = |key: &str| {
            spec.get(key)
                .map(|s| match_labels(s, &format!("{name}.{key}")))
        };
        PolicyModel {
            created: policy["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            images: serde_json::from_value(spec["images"].clone()).unwrap_or_default(),
            pod_selector: selector("podSelector"),
            pool_nodes: pool
                .and_then(|p| serde_json::from_value(p["nodeNames"].clone()).ok())
                .unwrap_or_default(),
            pool_selector: pool
                .and_then(|p| p.get("nodeSelector"))
                .map(|s| match_labels(s, &name)),
            dedicated: pool.is_some_and(|p| p["dedicated"].as_bool().unwrap_or(true)),
            effect: pool
                .and_then(|p| p["effect"].as_str())
                .unwrap_or("NoSchedule")
                .to_owned(),
            avoid: selector("avoid"),
            colocate: selector("colocateWith"),
            anchor_all: spec["anchorNamespaces"].as_str() == Some("All"),
            name,
        }
    }

    fn claims(&self, node: &str, labels: &Labels) -> bool {
        self.pool_nodes.contains(node)
            || self
                .pool_selector
                .as_ref()
                .is_some_and(|s| matches(s, labels))
    }

    /// The selector of the pods this policy anchors on (`colocateWith`/`avoid`).
    fn anchor_selector(&self) -> Option<&Labels> {
        self.colocate.as_ref().or(self.avoid.as_ref())
    }
}

fn matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// An image reference normalised as berth's globs see it (`nginx` is
/// `docker.io/library/nginx:latest`).
pub fn normalise(image: &str) -> String {
    let (first, _) = image.split_once('/').unwrap_or(("", image));
    let has_registry =
        !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut full = if has_registry {
        image.to_owned()
    } else if image.contains('/') {
        format!("docker.io/{image}")
    } else {
        format!("docker.io/library/{image}")
    };
    let last = full.rsplit('/').next().unwrap_or_default();
    if !last.contains(':') && !last.contains('@') {
        full.push_str(":latest");
    }
    full
}

/// A glob with `*` (any run of characters, `/` included), anchored at both ends.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// A pod as far as the audit reads it.
#[derive(Debug, Clone)]
pub struct AuditedPod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub applied: Vec<String>,
    pub images: Vec<String>,
    pub node: Option<String>,
    pub terminating: bool,
    pub finished: bool,
    pub owned: bool,
    pub gates: Vec<String>,
    /// The scheduler's word, for a pod not bound.
    pub unscheduled: Option<String>,
}

impl AuditedPod {
    pub fn from_pod(pod: &Pod) -> AuditedPod {
        let meta = &pod.metadata;
        let spec = pod.spec.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        AuditedPod {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            applied: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(APPLIED_ANNOTATION))
                .map(|a| a.split(',').map(|p| p.trim().to_owned()).collect())
                .unwrap_or_default(),
            images: spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .filter_map(|c| c.image.clone())
                .collect(),
            node: spec.node_name.clone(),
            terminating: meta.deletion_timestamp.is_some(),
            finished: matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")),
            owned: meta
                .owner_references
                .as_ref()
                .is_some_and(|o| !o.is_empty()),
            gates: spec
                .scheduling_gates
                .iter()
                .flatten()
                .map(|g| g.name.clone())
                .collect(),
            unscheduled: status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .map(|c| {
                    c.message
                        .clone()
                        .unwrap_or_else(|| c.reason.clone().unwrap_or_default())
                }),
        }
    }

    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn has_applied(&self, policy: &str) -> bool {
        self.applied.iter().any(|a| a == policy)
    }

    /// Bound and holding its node (not finished).
    fn holds_node(&self) -> bool {
        self.node.is_some() && !self.finished
    }
}

/// The policies in force and the namespaces' opt-in, as the cluster has them.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub policies: Vec<PolicyModel>,
    pub opt_in: BTreeMap<String, BTreeSet<String>>,
}

pub fn policy_api(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(names::GROUP, "v1alpha1", "PlacementPolicy"),
        "placementpolicies",
    );
    Api::all_with(client.clone(), &resource)
}

impl World {
    /// Policies not being deleted, oldest first, and every namespace's opt-in.
    pub async fn read(client: &Client) -> Result<World, kube::Error> {
        let (world, _) = Self::read_with_objects(client).await?;
        Ok(world)
    }

    async fn read_with_objects(client: &Client) -> Result<(World, Vec<Value>), kube::Error> {
        let objects: Vec<Value> = policy_api(client)
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|p| serde_json::to_value(p).unwrap())
            .collect();
        let mut policies: Vec<PolicyModel> = objects
            .iter()
            .filter(|p| p["metadata"].get("deletionTimestamp").is_none())
            .map(PolicyModel::from_json)
            .collect();
        policies.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let opt_in = namespaces
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|ns| {
                let names = ns
                    .metadata
                    .annotations?
                    .get(names::POLICIES_ANNOTATION)?
                    .split(',')
                    .map(|p| p.trim().to_owned())
                    .filter(|p| !p.is_empty())
                    .collect();
                Some((ns.metadata.name?, names))
            })
            .collect();
        Ok((World { policies, opt_in }, objects))
    }

    pub fn opts_in(&self, namespace: &str, policy: &str) -> bool {
        self.opt_in
            .get(namespace)
            .is_some_and(|p| p.contains(policy))
    }

    /// Whether `policy` applies to `pod` by namespace, images and labels.
    pub fn applies(&self, policy: &PolicyModel, pod: &AuditedPod) -> bool {
        self.opts_in(&pod.namespace, &policy.name)
            && (policy.images.is_empty()
                || pod.images.iter().any(|image| {
                    let full = normalise(image);
                    policy.images.iter().any(|g| glob(g, &full))
                }))
            && policy
                .pod_selector
                .as_ref()
                .is_none_or(|s| matches(s, &pod.labels))
    }

    /// The policies in force that apply to `pod` but that it lacks.
    pub fn missing(&self, pod: &AuditedPod) -> Vec<&str> {
        self.policies
            .iter()
            .filter(|p| self.applies(p, pod) && !pod.has_applied(&p.name))
            .map(|p| p.name.as_str())
            .collect()
    }

    /// Whether `pod` counts for `policy`'s anchor (`avoid`/`colocateWith`).
    fn counts_for(&self, policy: &PolicyModel, pod: &AuditedPod) -> bool {
        policy.anchor_all || self.opts_in(&pod.namespace, &policy.name)
    }

    /// The policy whose pool owns `node`: the oldest that claims it.
    fn pool_owner(&self, node: &str, labels: &Labels) -> Option<&PolicyModel> {
        self.policies.iter().find(|p| p.claims(node, labels))
    }

    /// berth's labels and taints (`key=value:effect`) `node` should carry with
    /// `pods` bound to it.
    pub fn desired(
        &self,
        node: &str,
        labels: &Labels,
        pods: &[&AuditedPod],
    ) -> (Labels, BTreeSet<String>) {
        let mut want = Labels::new();
        let mut taints = BTreeSet::new();
        if let Some(owner) = self.pool_owner(node, labels) {
            want.insert(POOL_LABEL.into(), owner.name.clone());
            if owner.dedicated {
                taints.insert(format!("{POOL_TAINT}={}:{}", owner.name, owner.effect));
            }
        }
        for policy in &self.policies {
            if let Some(selector) = policy.anchor_selector() {
                let anchored = pods.iter().any(|p| {
                    (!p.terminating || policy.avoid.is_some())
                        && matches(selector, &p.labels)
                        && self.counts_for(policy, p)
                });
                if anchored {
                    want.insert(
                        format!("{}{}", names::ANCHOR_LABEL_PREFIX, policy.name),
                        "true".into(),
                    );
                }
            }
            if policy.avoid.is_some()
                && pods.iter().any(|p| {
                    p.has_applied(&policy.name) && self.opts_in(&p.namespace, &policy.name)
                })
            {
                want.insert(
                    format!("{}{}", names::PLACED_LABEL_PREFIX, policy.name),
                    "true".into(),
                );
            }
        }
        (want, taints)
    }
}

/// Distinct findings of one kind (by key) and a few examples.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub keys: BTreeSet<String>,
    pub examples: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, key: String, example: impl FnOnce() -> String) {
        if self.keys.insert(key) && self.examples.len() < 3 {
            self.examples.push(example());
        }
    }

    pub fn count(&self) -> usize {
        self.keys.len()
    }

    fn merge(&mut self, other: &Tally) {
        for (i, key) in other.keys.iter().enumerate() {
            let example = other.examples.get(i).cloned();
            self.add(key.clone(), || example.unwrap_or_else(|| key.clone()));
        }
    }
}

/// Everything the audit found in one case.
#[derive(Debug, Clone, Default)]
pub struct Findings {
    pub unentitled: Tally,
    /// Pairs both admitted by berth that shared a node.
    pub exclusion: Tally,
    /// Pairs that shared a node where one was admitted without berth's decision.
    pub exclusion_missed: Tally,
    pub apart: Tally,
    /// Pods made by a controller (bare pods are judged from their create's answer)
    /// stored without berth's decision.
    pub missed: Tally,
    pub stuck: Tally,
    /// Relists the watch went through (the apiserver restarting, the link cut).
    pub relists: u32,
}

impl Findings {
    pub fn merge(&mut self, other: &Findings) {
        self.unentitled.merge(&other.unentitled);
        self.exclusion.merge(&other.exclusion);
        self.exclusion_missed.merge(&other.exclusion_missed);
        self.apart.merge(&other.apart);
        self.missed.merge(&other.missed);
        self.stuck.merge(&other.stuck);
        self.relists += other.relists;
    }
}

/// Checks `pod`, just bound, against the pods bound to its node at that point.
fn check_binding(world: &World, pod: &AuditedPod, others: &[&AuditedPod], found: &mut Findings) {
    let Some(node) = pod.node.as_deref() else {
        return;
    };
    if pod.finished {
        return;
    }
    // The node's labels are not needed: the suite's pools name their nodes.
    if let Some(owner) = world.pool_owner(node, &Labels::new())
        && owner.dedicated
        && !pod.terminating
        && !(pod.has_applied(&owner.name) && world.opts_in(&pod.namespace, &owner.name))
    {
        found.unentitled.add(pod.uid.clone(), || {
            format!("{} on {node} (pool {})", pod.key(), owner.name)
        });
    }
    for policy in &world.policies {
        if let Some(avoid) = &policy.avoid {
            let admitted = |p: &AuditedPod| {
                p.has_applied(&policy.name) && world.opts_in(&p.namespace, &policy.name)
            };
            let avoided = |p: &AuditedPod| matches(avoid, &p.labels) && world.counts_for(policy, p);
            for other in others.iter().filter(|o| o.uid != pod.uid) {
                if (admitted(pod) && avoided(other)) || (admitted(other) && avoided(pod)) {
                    let mut pair = [pod.key(), other.key()];
                    pair.sort();
                    let key = format!("{} {}", pair[0], pair[1]);
                    let example =
                        || format!("{} and {} on {node} ({})", pair[0], pair[1], policy.name);
                    if world.missing(pod).is_empty() && world.missing(other).is_empty() {
                        found.exclusion.add(key.clone(), example);
                    } else {
                        found.exclusion_missed.add(key, example);
                    }
                }
            }
        }
        if let Some(colocate) = &policy.colocate
            && pod.has_applied(&policy.name)
            && world.opts_in(&pod.namespace, &policy.name)
            && !others.iter().any(|o| {
                !o.terminating && matches(colocate, &o.labels) && world.counts_for(policy, o)
            })
        {
            found.apart.add(pod.uid.clone(), || {
                format!("{} on {node}, no {} pod there", pod.key(), policy.name)
            });
        }
    }
}

/// Checks every bound pod of `pods` against the others on its node.
pub fn check_all(world: &World, pods: &[AuditedPod], found: &mut Findings) {
    let mut by_node: BTreeMap<&str, Vec<&AuditedPod>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.holds_node()) {
        by_node
            .entry(pod.node.as_deref().unwrap())
            .or_default()
            .push(pod);
    }
    for on_node in by_node.values() {
        for pod in on_node {
            check_binding(world, pod, on_node, found);
        }
    }
}

/// Watches the suite's pods (label `berth.test/load`) and checks each binding as
/// it happens, in the order of the cluster's history.
pub struct Recorder {
    world: Arc<Mutex<World>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Findings>,
}

impl Recorder {
    pub fn start(client: &Client, world: World) -> Recorder {
        let world = Arc::new(Mutex::new(world));
        let stop = CancellationToken::new();
        let api: Api<Pod> = Api::all(client.clone());
        let task = {
            let (world, stop) = (world.clone(), stop.clone());
            tokio::spawn(async move {
                let config = watcher::Config::default().labels(LOAD_LABEL);
                let mut events = watcher::watcher(api, config).default_backoff().boxed();
                let mut live: BTreeMap<String, AuditedPod> = BTreeMap::new();
                let mut relist: Option<BTreeMap<String, AuditedPod>> = None;
                let mut found = Findings::default();
                let mut lists = 0u32;
                loop {
                    let event = tokio::select! {
                        () = stop.cancelled() => break,
                        event = events.next() => match event {
                            Some(Ok(event)) => event,
                            Some(Err(_)) => continue,
                            None => break,
                        },
                    };
                    let world = world.lock().unwrap().clone();
                    match event {
                        Event::Apply(pod) => {
                            let view = AuditedPod::from_pod(&pod);
                            let before = live.insert(view.uid.clone(), view.clone());
                            observe(&world, &view, before.as_ref(), &live, &mut found);
                        }
                        Event::Delete(pod) => {
                            live.remove(pod.metadata.uid.as_deref().unwrap_or_default());
                        }
                        Event::Init => relist = Some(BTreeMap::new()),
                        Event::InitApply(pod) => {
                            let view = AuditedPod::from_pod(&pod);
                            relist
                                .get_or_insert_default()
                                .insert(view.uid.clone(), view);
                        }
                        Event::InitDone => {
                            lists += 1;
                            let fresh = relist.take().unwrap_or_default();
                            let before = std::mem::replace(&mut live, fresh);
                            for view in live.values() {
                                observe(&world, view, before.get(&view.uid), &live, &mut found);
                            }
                        }
                    }
                }
                // The first list is the watch starting, not a relist.
                found.relists = lists.saturating_sub(1);
                found
            })
        };
        Recorder { world, stop, task }
    }

    /// The policies or opt-ins changed (the test edited or deleted a policy).
    pub fn set_world(&self, world: World) {
        *self.world.lock().unwrap() = world;
    }

    pub async fn finish(self) -> Findings {
        self.stop.cancel();
        self.task.await.expect("the recorder")
    }
}

/// A pod seen (again): a controller's pod is judged for berth's decision when
/// first seen, and any pod is checked when it becomes bound.
fn observe(
    world: &World,
    view: &AuditedPod,
    before: Option<&AuditedPod>,
    live: &BTreeMap<String, AuditedPod>,
    found: &mut Findings,
) {
    if before.is_none() && view.owned {
        let missing = world.missing(view);
        if !missing.is_empty() {
            found.missed.add(view.uid.clone(), || {
                format!("{} lacks {}", view.key(), missing.join(","))
            });
        }
    }
    let newly_bound = view.holds_node() && before.is_none_or(|b| b.node.is_none());
    if newly_bound {
        let node = view.node.as_deref();
        let others: Vec<&AuditedPod> = live
            .values()
            .filter(|p| p.holds_node() && p.node.as_deref() == node)
            .collect();
        check_binding(world, view, &others, found);
    }
}

/// The suite's pods now: every binding checked again, and the pods left neither
/// bound nor going (stuck), with the gate or the scheduler's word on each.
pub async fn final_state(client: &Client) -> Result<Findings, kube::Error> {
    let world = World::read(client).await?;
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods.list(&ListParams::default().labels(LOAD_LABEL)).await?;
    let views: Vec<AuditedPod> = list.items.iter().map(AuditedPod::from_pod).collect();
    let mut found = Findings::default();
    check_all(&world, &views, &mut found);
    for view in views.iter().filter(|v| v.node.is_none() && !v.terminating) {
        found.stuck.add(view.uid.clone(), || {
            let why = if view.gates.is_empty() {
                view.unscheduled
                    .clone()
                    .unwrap_or_else(|| "not scheduled yet".into())
            } else {
                format!("gated by {}", view.gates.join(","))
            };
            format!("{}: {why}", view.key())
        });
    }
    Ok(found)
}

/// The pods of the suite that are neither bound nor being deleted.
pub async fn unbound(client: &Client) -> Result<usize, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods.list(&ListParams::default().labels(LOAD_LABEL)).await?;
    Ok(list
        .items
        .iter()
        .map(AuditedPod::from_pod)
        .filter(|v| v.node.is_none() && !v.terminating)
        .count())
}

/// What is wrong with the Nodes and the policies now, one line each: berth's
/// labels and taints against what the policies and the pods bound there say,
/// `keep` (node, taint key) that another owner put there and must stay, every
/// policy `Ready`, and none stuck being deleted. Empty when all is right.
pub async fn node_errors(
    client: &Client,
    keep: &[(&str, &str)],
) -> Result<Vec<String>, kube::Error> {
    let (world, objects) = World::read_with_objects(client).await?;
    let pods: Api<Pod> = Api::all(client.clone());
    let views: Vec<AuditedPod> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(AuditedPod::from_pod)
        .filter(AuditedPod::holds_node)
        .collect();
    let nodes: Api<Node> = Api::all(client.clone());
    let mut errors = Vec::new();
    for node in nodes.list(&ListParams::default()).await?.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let on_node: Vec<&AuditedPod> = views
            .iter()
            .filter(|p| p.node.as_deref() == Some(name.as_str()))
            .collect();
        let (want, want_taints) = world.desired(&name, &labels, &on_node);
        let have: Labels = labels
            .iter()
            .filter(|(k, _)| k.starts_with(BERTH_LABEL_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        let have_taints: BTreeSet<String> = taints
            .iter()
            .filter(|t| t.key == POOL_TAINT)
            .map(|t| {
                format!(
                    "{}={}:{}",
                    t.key,
                    t.value.clone().unwrap_or_default(),
                    t.effect
                )
            })
            .collect();
        if have != want || have_taints != want_taints {
            errors.push(format!(
                "{name}: has {have:?} {have_taints:?}, should have {want:?} {want_taints:?}"
            ));
        }
        for (node_name, key) in keep {
            if *node_name == name && !taints.iter().any(|t| t.key == *key) {
                errors.push(format!("{name}: lost the taint {key}"));
            }
        }
    }
    for policy in &objects {
        let name = policy["metadata"]["name"].as_str().unwrap_or_default();
        if policy["metadata"].get("deletionTimestamp").is_some() {
            errors.push(format!("policy {name}: still being deleted"));
            continue;
        }
        let ready = policy["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready");
        match ready {
            Some(c) if c["status"] == "True" => {}
            other => errors.push(format!("policy {name}: not Ready ({other:?})")),
        }
        let unentitled = policy["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "UnentitledPods" && c["status"] == "True");
        if unentitled {
            errors.push(format!("policy {name}: UnentitledPods"));
        }
    }
    Ok(errors)
}
