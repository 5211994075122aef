#![cfg(feature = "oracle")]
//! The MutatingAdmissionPolicy `berth-placement`, run by the apiserver's own
//! admission code (the oracle), against berth's webhook decision on generated
//! worlds: the differential `berth-placement` must pass before it places pods
//! with berth down.
//!
//! For every generated pod, as the apiserver hands it to admission:
//! - where the policy decides the pod (`decidable` and no webhook-only policy),
//!   the pod it makes is the pod berth's webhook makes, lists compared as sets;
//! - where it does not, it changes nothing;
//! - it never fails (`failurePolicy: Fail` would refuse the pod);
//! - run again on its own output or on the webhook's, it changes nothing, and the
//!   webhook finds nothing to change in its output: both running together (the
//!   policy first, then the webhook) change nothing twice.
//!
//! The worlds are `differential::world`'s (pools Required and Preferred, dedicated
//! or not, node affinity; pods with several terms, `matchFields`, empty terms,
//! wildcard and forged tolerations, preferences spelled otherwise), with images,
//! pod labels, `coscheduled`, schedulers, webhook-only policies and namespace
//! overrides added. `STATIC_WORLDS` sets how many (default 5,000: over 10,000
//! pods the policy decides).

#[allow(dead_code)]
mod differential;

use berth::admission::static_cel;
use berth::placement::namespace::NamespaceInfo;
use berth::placement::static_placement::{STATIC_PLACEMENT_NAME, StaticPlacementSpec};
use berth::placement::{Input, Requester, build_patch, decide};
use berth::policy::{PlacementPolicy, PolicySet};
use differential::oracle::Oracle;
use differential::world::{DAEMONSET_CONTROLLER, World, arb_world, compile};
use k8s_openapi::api::core::v1::Namespace;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Image globs a policy may have, some CEL cannot express.
const GLOBS: [&[&str]; 5] = [
    &["*cdn*"],
    &["docker.io/library/nginx:*"],
    &["registry.example.com/cdn/*", "ghcr.io/*/app:v[12]"],
    &["*:latest"],
    &["{docker.io,ghcr.io}/**/app*"],
];

/// Images a pod may run: short names, registries with ports, digests, and
/// references no parser takes.
const IMAGES: [&str; 13] = [
    "nginx",
    "busybox:1.36",
    "registry.example.com/cdn/edge:3",
    "ghcr.io/org/app:v2",
    "nginx",
    "nginx:1.27",
    "registry.example.com/cdn/upload:2",
    "registry.example.com:5000/cdn/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "ghcr.io/org/app:v1",
    "ghcr.io/org/app:v3",
    "localhost/cdn-cache",
    "UPPER/Case:tag",
    "index.docker.io/library/busybox",
];

/// The namespace overrides of images.
const OVERRIDES: [&str; 3] = ["*cdn*", "ghcr.io/*, docker.io/*", "[bad"];

/// Added to a policy: its globs (an index into GLOBS), a podSelector,
/// `coscheduled`, a scheduler, and `avoid` (which makes it webhook-only).
type PolicyExtras = (Option<usize>, bool, bool, Option<&'static str>, bool);
/// Added to a namespace: an image override (into OVERRIDES), a scheduler, and a
/// broken berth annotation.
type NamespaceExtras = (Option<usize>, Option<&'static str>, bool);
/// Added to a pod: its images (into IMAGES), an `app` label, the `coscheduled`
/// label, the label an `avoid` selects, a scheduler, and whether it keeps the
/// pool tolerations the world gave it (a pod that brings one it is not entitled
/// to is the webhook's, which warns).
type PodExtras = (
    Vec<usize>,
    Option<&'static str>,
    bool,
    bool,
    Option<&'static str>,
    bool,
);

/// What is added to a generated world: per policy, per namespace and per pod.
#[derive(Debug, Clone)]
struct Extras {
    policies: Vec<PolicyExtras>,
    namespaces: Vec<NamespaceExtras>,
    pods: Vec<PodExtras>,
}

fn arb_extras() -> impl Strategy<Value = Extras> {
    let policy = (
        prop::option::weighted(0.6, 0..GLOBS.len()),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.2, prop::sample::select(vec!["batch", "other"])),
        prop::bool::weighted(0.08),
    );
    let namespace = (
        prop::option::weighted(0.3, 0..OVERRIDES.len()),
        prop::option::weighted(
            0.2,
            prop::sample::select(vec!["ns-scheduler", "ns-scheduler", "bad name!"]),
        ),
        prop::bool::weighted(0.03),
    );
    let pod = (
        prop::collection::vec(0..IMAGES.len(), 1..=3),
        prop::option::weighted(0.5, prop::sample::select(vec!["a", "b"])),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop::option::weighted(
            0.3,
            prop::sample::select(vec!["default-scheduler", "mine", "batch"]),
        ),
        prop::bool::weighted(0.4),
    );
    (
        prop::collection::vec(policy, 3),
        prop::collection::vec(namespace, 3),
        prop::collection::vec(pod, 8),
    )
        .prop_map(|(policies, namespaces, pods)| Extras {
            policies,
            namespaces,
            pods,
        })
}

/// `world` with `extras` added.
fn enrich(mut world: World, extras: &Extras) -> World {
    let names: Vec<String> = world
        .policies
        .iter()
        .map(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    for (policy, (globs, selector, cosched, scheduler, webhook_only)) in
        world.policies.iter_mut().zip(&extras.policies)
    {
        let spec = &mut policy["spec"];
        if let Some(g) = globs {
            spec["images"] = json!(GLOBS[*g]);
        }
        if *selector {
            spec["podSelector"] = json!({"matchLabels": {"app": "a"}});
        }
        if *cosched {
            spec["coscheduled"] = json!({"matchLabels": {"group": "g"}});
        }
        if let Some(s) = scheduler {
            spec["schedulerName"] = json!(s);
        }
        if *webhook_only && spec.get("colocateWith").is_none() {
            spec["avoid"] = json!({"matchLabels": {"role": "apart"}});
        }
    }
    for (namespace, (images, scheduler, broken)) in
        world.namespaces.iter_mut().zip(&extras.namespaces)
    {
        let annotations = &mut namespace["metadata"]["annotations"];
        if annotations.is_null() {
            *annotations = json!({});
        }
        if let (Some(o), Some(policy)) = (images, names.first()) {
            annotations[format!("berth.io/images.{policy}")] = json!(OVERRIDES[*o]);
        }
        if let Some(s) = scheduler {
            annotations["berth.io/scheduler-name"] = json!(s);
        }
        if *broken {
            annotations["berth.io/policy"] = json!("typo");
        }
    }
    for (case, (images, app, group, apart, scheduler, pool_tolerations)) in
        world.pods.iter_mut().zip(&extras.pods)
    {
        if !pool_tolerations && let Some(list) = case.pod["spec"]["tolerations"].as_array_mut() {
            list.retain(|t| t["key"] != berth::names::POOL_TAINT);
        }
        let pod = &mut case.pod;
        let containers: Vec<Value> = images
            .iter()
            .enumerate()
            .map(|(i, image)| json!({"name": format!("c{i}"), "image": IMAGES[*image]}))
            .collect();
        pod["spec"]["containers"] = json!(containers);
        let labels = &mut pod["metadata"]["labels"];
        if labels.is_null() {
            *labels = json!({});
        }
        if let Some(app) = app {
            labels["app"] = json!(app);
        }
        if *group {
            labels["group"] = json!("g");
        }
        if *apart {
            labels["role"] = json!("apart");
        }
        if let Some(s) = scheduler {
            pod["spec"]["schedulerName"] = json!(s);
        }
    }
    world
}

fn worlds(count: u64) -> impl Iterator<Item = (u64, World)> {
    let seed = env_number("STATIC_SEED", 44);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = (arb_world(), arb_extras());
    (0..count).map(move |i| {
        let (world, extras) = strategy.new_tree(&mut runner).expect("a world").current();
        (i, enrich(world, &extras))
    })
}

/// The pod with its lists in a canonical order (and each requirement's values
/// sorted), so that two pods equal as sets compare equal.
fn canonical(pod: &Value) -> Value {
    fn sort(list: &mut Value) {
        if let Some(items) = list.as_array_mut() {
            for item in items.iter_mut() {
                if let Some(values) = item.get_mut("values").and_then(Value::as_array_mut) {
                    values.sort_by_key(|v| v.to_string());
                }
            }
            items.sort_by_key(|i| i.to_string());
        }
    }
    let mut pod = pod.clone();
    sort(&mut pod["spec"]["tolerations"]);
    let affinity = &mut pod["spec"]["affinity"]["nodeAffinity"];
    if let Some(terms) = affinity
        .pointer_mut("/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array_mut)
    {
        for term in terms {
            sort(&mut term["matchExpressions"]);
            sort(&mut term["matchFields"]);
        }
    }
    if let Some(preferred) = affinity
        .get_mut("preferredDuringSchedulingIgnoredDuringExecution")
        .filter(|p| p.is_array())
    {
        for term in preferred.as_array_mut().into_iter().flatten() {
            sort(&mut term["preference"]["matchExpressions"]);
        }
        sort(preferred);
    }
    strip_nulls(&mut pod);
    pod
}

/// Fields that are `null`, `{}` or `[]`, which the apiserver drops when it
/// decodes a pod into its types (and the canonical form's indexing adds).
fn strip_nulls(value: &mut Value) {
    if let Some(map) = value.as_object_mut() {
        map.retain(|_, v| {
            !(v.is_null()
                || v.as_object().is_some_and(|o| o.is_empty())
                || v.as_array().is_some_and(|a| a.is_empty()))
        });
        for v in map.values_mut() {
            strip_nulls(v);
        }
    } else if let Some(items) = value.as_array_mut() {
        for v in items {
            strip_nulls(v);
        }
    }
}

/// The params the controller would write for `world`.
fn params(world: &World, set: &PolicySet) -> Value {
    let overrides: Vec<String> = world
        .namespaces
        .iter()
        .filter_map(|n| n["metadata"]["annotations"].as_object())
        .flat_map(|a| {
            a.iter()
                .filter(|(k, _)| k.starts_with("berth.io/images."))
                .filter_map(|(_, v)| v.as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        })
        .collect();
    let spec = StaticPlacementSpec::compile(set, overrides.iter().map(String::as_str));
    json!({"apiVersion": "berth.io/v1alpha1", "kind": "StaticPlacement",
        "metadata": {"name": STATIC_PLACEMENT_NAME}, "spec": spec})
}

/// The policy with one mutation that only says whether it decides the pod.
fn marker(policy: &Value) -> Value {
    let mut marker = policy.clone();
    marker["spec"]["mutations"] = json!([{"patchType": "JSONPatch", "jsonPatch": {"expression":
        "[JSONPatch{op: 'add', path: '/metadata/labels', value: \
          {'decided': string(variables.places)}}]"}}]);
    marker
}

fn case(pod: &Value, namespace: &Value, params: &Value, daemonset: bool) -> Value {
    let (username, groups) = if daemonset {
        (DAEMONSET_CONTROLLER, vec!["system:serviceaccounts"])
    } else {
        ("tenant", vec!["system:authenticated"])
    };
    json!({"operation": "CREATE", "resource": "pods", "object": pod, "namespace": namespace,
        "params": params, "username": username, "groups": groups})
}

/// The webhook's answer for `pod`: the pod it makes, or `None` when it refuses.
fn webhook(
    pod: &Value,
    namespace: &NamespaceInfo,
    set: &PolicySet,
    daemonset: bool,
) -> Option<Value> {
    let decision = decide(&Input {
        pod,
        namespace,
        policies: set,
        nodes: None,
        requester: if daemonset {
            Requester::from_username(DAEMONSET_CONTROLLER)
        } else {
            Requester::Other
        },
        groups: Default::default(),
    });
    if decision.denial.is_some() {
        return None;
    }
    let mut out = pod.clone();
    json_patch::patch(&mut out, &build_patch(pod, &decision.grants))
        .expect("berth's patch applies");
    Some(out)
}

#[derive(Default, Debug)]
struct Tally {
    pods: usize,
    decided: usize,
    left_to_webhook: usize,
    refused_by_webhook: usize,
    changed: usize,
}

/// One generated pod, as the apiserver hands it to admission, with its world.
struct Form {
    label: String,
    pod: Value,
    namespace: Value,
    daemonset: bool,
    /// The world's policies, and the params the controller writes for them.
    set: std::rc::Rc<PolicySet>,
    params: std::rc::Rc<Value>,
}

/// Worlds are judged this many at a time: one oracle request runs the policy on
/// all their pods, so it is compiled once for them.
const BATCH: usize = 250;

#[test]
fn the_apiserver_places_pods_as_the_webhook_does() {
    let count = env_number("STATIC_WORLDS", 5000);
    let policy = static_cel::documents(berth::names::BERTH_SERVICE_ACCOUNT)
        .into_iter()
        .next()
        .expect("the policy");
    let marker = marker(&policy);
    let mut oracle = Oracle::start();
    let mut tally = Tally::default();
    let mut failures: Vec<String> = Vec::new();
    let mut worlds = worlds(count).peekable();
    while worlds.peek().is_some() && failures.len() < 5 {
        let mut forms: Vec<Form> = Vec::new();
        for (index, world) in worlds.by_ref().take(BATCH) {
            let set = std::rc::Rc::new(compile(&world));
            let params = std::rc::Rc::new(params(&world, &set));
            let pods: Vec<Value> = world.pods.iter().map(|c| c.pod.clone()).collect();
            let answers = oracle.evaluate(&pods, &[]);
            for (i, (case, answer)) in world.pods.iter().zip(&answers).enumerate() {
                // The pod as the apiserver hands it to admission: decoded with the
                // v1 defaults (a pod it cannot decode never reaches admission).
                let Some(pod) = answer.stored.clone() else {
                    continue;
                };
                let namespace = world
                    .namespaces
                    .iter()
                    .find(|n| n["metadata"]["name"] == pod["metadata"]["namespace"])
                    .expect("the pod's namespace")
                    .clone();
                forms.push(Form {
                    label: format!("world {index} pod {i}"),
                    pod,
                    namespace,
                    daemonset: case.daemonset,
                    set: set.clone(),
                    params: params.clone(),
                });
            }
        }
        let cases: Vec<Value> = forms
            .iter()
            .map(|f| case(&f.pod, &f.namespace, &f.params, f.daemonset))
            .collect();
        let placed = oracle.mutating_policy(&policy, &cases);
        let decided = oracle.mutating_policy(&marker, &cases);
        let mut again: Vec<(&Form, Value)> = Vec::new();
        for (form, (answer, marked)) in forms.iter().zip(placed.iter().zip(&decided)) {
            tally.pods += 1;
            let label = &form.label;
            if let Some(error) = answer.error.as_ref().or(marked.error.as_ref()) {
                let tail: String = error
                    .chars()
                    .skip(error.chars().count().saturating_sub(600))
                    .collect();
                failures.push(format!(
                    "{label}: the policy failed: ...{tail}\n{}",
                    form.pod
                ));
                continue;
            }
            let info = NamespaceInfo::from_namespace(
                &serde_json::from_value::<Namespace>(form.namespace.clone()).expect("a Namespace"),
            );
            let out = answer.object.clone().unwrap_or_else(|| form.pod.clone());
            if canonical(&out) != canonical(&form.pod) {
                tally.changed += 1;
            }
            let says_decided = marked
                .object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/labels/decided"))
                .and_then(Value::as_str)
                == Some("true");
            let Some(by_webhook) = webhook(&form.pod, &info, &form.set, form.daemonset) else {
                tally.refused_by_webhook += 1;
                continue;
            };
            if !says_decided {
                tally.left_to_webhook += 1;
                if canonical(&out) != canonical(&form.pod) {
                    failures.push(format!(
                        "{label}: left to the webhook, yet changed:\n{}\n{out}",
                        form.pod
                    ));
                }
                continue;
            }
            tally.decided += 1;
            if canonical(&out) != canonical(&by_webhook) {
                failures.push(format!(
                    "{label}: the apiserver and the webhook differ\nnamespace {}\nparams {}\npod {}\napiserver {}\nwebhook  {}",
                    form.namespace["metadata"],
                    form.params["spec"],
                    form.pod,
                    canonical(&out),
                    canonical(&by_webhook)
                ));
                continue;
            }
            // The webhook, after the policy, finds nothing to change.
            if let Some(after) = webhook(&out, &info, &form.set, form.daemonset)
                && after != out
            {
                failures.push(format!(
                    "{label}: the webhook changed the policy's output:\n{out}\n{after}"
                ));
            }
            again.push((form, by_webhook));
        }
        // The policy, on the webhook's output (a re-admitted pod), changes nothing.
        let cases: Vec<Value> = again
            .iter()
            .map(|(f, pod)| case(pod, &f.namespace, &f.params, f.daemonset))
            .collect();
        for ((form, pod), answer) in again.iter().zip(oracle.mutating_policy(&policy, &cases)) {
            let label = &form.label;
            if let Some(error) = answer.error {
                failures.push(format!("{label}: again, the policy failed: {error}"));
            } else if let Some(object) = answer.object
                && canonical(&object) != canonical(pod)
            {
                failures.push(format!(
                    "{label}: again, the policy changed the webhook's pod:\n{pod}\n{object}"
                ));
            }
        }
    }
    println!("{tally:?}");
    assert!(
        failures.is_empty(),
        "{} failures; the first:\n{}",
        failures.len(),
        failures
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    // Two pods a world on average, so 10,000 at the default count.
    let wanted = count as usize * 2;
    assert!(
        tally.decided >= wanted,
        "the policy decided {} pods, fewer than the {wanted} this count of worlds should give",
        tally.decided
    );
}

/// The largest pod within berth's bounds that the policy still decides: 128
/// tolerations (berth's own among them, to be compared pairwise), 32 required
/// terms and 64 preferred ones of 64 expressions each, 16 distinct images among
/// 128 containers and 128 init containers, 64 labels; in a namespace every one of
/// `policies` policies applies to, each with images, a podSelector, a pool,
/// node affinity and a scheduler.
fn worst_case(policies: usize) -> (Value, Value, PolicySet) {
    let requirement =
        |i: usize| json!({"key": format!("k{i}"), "operator": "In", "values": ["a", "b", "c"]});
    let term = || json!({"matchExpressions": (0..64).map(requirement).collect::<Vec<_>>()});
    let tolerations: Vec<Value> = (0..128)
        .map(|i| {
            if i % 2 == 0 {
json!({"key": berth::names::POOL_TAINT, "operator": "Equal", "value": "p0", "effect": "NoSchedule"})
            } else {
                json!({"key": format!("t{i}"), "operator": "Exists"})
            }
        })
        .collect();
    let containers = |prefix: &str| -> Vec<Value> {
        (0..128)
            .map(|i| json!({"name": format!("{prefix}{i}"), "image": format!("registry.example.com/team/app{}:v1", i % 16)}))
            .collect()
    };
    let labels: serde_json::Map<String, Value> =
        (0..64).map(|i| (format!("l{i}"), json!("v"))).collect();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "worst", "namespace": "ns-all", "labels": labels},
        "spec": {"containers": containers("c"), "initContainers": containers("i"),
            "tolerations": tolerations,
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": (0..32).map(|_| term()).collect::<Vec<_>>()},
                "preferredDuringSchedulingIgnoredDuringExecution": (0..64).map(|_| json!({"weight": 10, "preference": term()})).collect::<Vec<_>>()}}}});
    let list: Vec<PlacementPolicy> = (0..policies)
        .map(|i| {
            serde_json::from_value(json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                "metadata": {"name": format!("p{i}")},
                "spec": {"namespaceSelector": {}, "images": [format!("registry.example.com/*/app{}:*", i % 16), "*:v2"],
                    "podSelector": {"matchLabels": {"l1": "v"}, "matchExpressions": [{"key": "l2", "operator": "Exists"}]},
                    "pool": {"nodeNames": [format!("n{i}")], "placement": if i % 2 == 0 { "Required" } else { "Preferred" }},
                    "nodeAffinity": {"required": [{"key": "zone", "operator": "In", "values": ["a", "b"]}],
                        "preferred": [{"weight": 5, "preference": {"key": format!("disk{i}"), "operator": "Exists"}}]},
                    "schedulerName": "batch"}}))
            .expect("a PlacementPolicy")
        })
        .collect();
    let (set, errors) = PolicySet::compile(&list);
    assert!(errors.is_empty(), "{errors:?}");
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "ns-all", "labels": {"kubernetes.io/metadata.name": "ns-all"}}});
    (pod, namespace, set)
}

/// What the policy costs the apiserver, for an ordinary pod and for the worst one
/// within bounds, printed (`--nocapture`) for docs/benchmarks.md, where the
/// webhook's figures stand beside them. The worst case must be decided within
/// the apiserver's CEL budget: over it, `failurePolicy: Fail` would refuse it.
#[test]
fn the_policy_stays_within_its_cost_budget() {
    let policy = static_cel::documents(berth::names::BERTH_SERVICE_ACCOUNT)
        .into_iter()
        .next()
        .expect("the policy");
    let mut oracle = Oracle::start();
    let ordinary = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns-all", "labels": {"l1": "v", "l2": "x"}},
        "spec": {"containers": [{"name": "c", "image": "registry.example.com/team/app3:v2"}]}});
    println!(
        "pod        policies   CEL cost  apiserver µs (median of 5, the apiserver's own code)"
    );
    for (label, policies) in [
        ("ordinary", 1),
        ("ordinary", 20),
        ("worst", 1),
        ("worst", 20),
        ("worst", 64),
    ] {
        let (worst, namespace, set) = worst_case(policies);
        let pod = if label == "worst" {
            worst
        } else {
            ordinary.clone()
        };
        let form = oracle.evaluate(std::slice::from_ref(&pod), &[])[0]
            .stored
            .clone()
            .expect("decoded");
        let world_params = {
            let spec = StaticPlacementSpec::compile(&set, std::iter::empty());
            json!({"apiVersion": "berth.io/v1alpha1", "kind": "StaticPlacement",
                "metadata": {"name": STATIC_PLACEMENT_NAME}, "spec": spec})
        };
        let cases: Vec<Value> = (0..5)
            .map(|_| case(&form, &namespace, &world_params, false))
            .collect();
        let answers = oracle.mutating_policy(&policy, &cases);
        for answer in &answers {
            if let Some(error) = &answer.error {
                let tail: String = error
                    .chars()
                    .skip(error.chars().count().saturating_sub(400))
                    .collect();
                panic!("{label} with {policies} policies: ...{tail}");
            }
        }
        let applied = answers[0]
            .object
            .as_ref()
            .and_then(|o| o.pointer(&format!("/metadata/annotations/{}", "berth.io~1applied")))
            .and_then(Value::as_str)
            .map(|a| a.split(',').count())
            .unwrap_or(0);
        assert_eq!(
            applied, policies,
            "{label}: every policy applies, and is recorded"
        );
        let mut nanos: Vec<i64> = answers.iter().map(|a| a.nanos).collect();
        nanos.sort_unstable();
        // The same pod, decided by the webhook: admitted, with the same record.
        let info = NamespaceInfo::from_namespace(
            &serde_json::from_value::<Namespace>(namespace).expect("a Namespace"),
        );
        let by_webhook = webhook(&form, &info, &set, false).expect("admitted");
        assert_eq!(
            canonical(answers[0].object.as_ref().expect("placed")),
            canonical(&by_webhook),
            "{label} with {policies} policies"
        );
        println!(
            "{label:<10} {policies:>8}  {:>9}  {:>12}",
            answers[0].cost,
            nanos[2] / 1000
        );
    }
}
