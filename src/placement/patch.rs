//! The JSON Patch that turns the pod as admitted into the pod berth wants.
//!
//! Patches are targeted operations computed from berth's view of the pod as sent
//! ([`PodObject`]: which objects and lists it has, and what they hold), never the
//! pod re-serialised: fields unknown to the compiled Kubernetes types survive
//! untouched. A missing object is added with what goes in it, in one operation.
//! One builder holds the rules and writes each operation to a sink ([`Ops`]):
//! JSON Patch operations for the controller and the CLI ([`build_patch`]), or
//! JSON text straight into the webhook's answer ([`write_patch`]).
//!
//! Merge rules (SPEC "Merge, never clobber"):
//! - berth's required node requirements are ANDed into *every* existing
//!   nodeSelectorTerm: terms are ORed, so adding a term of our own would widen
//!   placement instead of narrowing it; a pod without terms gets one; an empty
//!   term (it matches no node) is left empty;
//! - preferred terms and tolerations are appended once, never duplicated;
//! - items are compared by what they mean to Kubernetes, never by spelling
//!   ([`super::canonical`]): the pod berth sees again after the apiserver stored
//!   it spells them the apiserver's way;
//! - a required node affinity with no terms (or only empty ones) matches no node
//!   and is left so: berth never makes a pod placeable where Kubernetes would
//!   place it nowhere;
//! - what berth owns and grants (pool tolerations, preferred pool and anchor
//!   terms, the applied annotation) is removed unless it is still wanted, so
//!   admitting berth's own output yields an empty patch and a pod cannot bring
//!   berth's grants itself;
//! - a required expression is never removed, even one on a key berth owns: it
//!   only narrows where the pod may land, and removing it would widen that;
//! - everything else the user wrote is kept verbatim.

use std::collections::BTreeSet;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use serde::Serialize;
use serde_json::Value;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, PreferredSchedulingTerm, Toleration};

use super::canonical::{
    PreferredKey, TolerationKey, preferred_key, requirement_key, toleration_key,
};
use super::entitlement::is_owned_toleration;
use super::grants::{Grants, QueuePriority};
use super::pod::PodSource;
use super::selection::is_empty_term;
use crate::names::{APPLIED_ANNOTATION, is_berth_gate, is_owned_node_key};
use crate::objects::PodObject;
use crate::objects::pod::Part;

const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";

/// Where the patch's operations go. The rules live once, in [`Builder`]; a sink
/// only writes what it is given: as JSON Patch values ([`build_patch`], for the
/// controller and the CLI) or as JSON text straight into the webhook's answer
/// ([`write_patch`]), with no JSON value built between.
pub trait Ops {
    fn add<V: Serialize + ?Sized>(&mut self, path: &[&str], value: &V);
    fn remove(&mut self, path: &[&str]);
}

impl Ops for Vec<PatchOperation> {
    fn add<V: Serialize + ?Sized>(&mut self, path: &[&str], value: &V) {
        // What berth writes has string keys only, so it always becomes a JSON
        // value.
        let value = serde_json::to_value(value).unwrap_or_default();
        self.push(add(path, value));
    }

    fn remove(&mut self, path: &[&str]) {
        self.push(remove(path));
    }
}

/// A JSON Patch written as text, as the webhook answers it.
#[derive(Debug, Default)]
pub struct PatchText {
    /// The JSON array of operations, without its closing bracket; empty when there
    /// are none.
    json: Vec<u8>,
    /// A reused buffer for the JSON Pointer of the operation being written.
    path: String,
    /// Set when a value could not be written, which would leave the text cut short.
    failed: Option<serde_json::Error>,
}

impl PatchText {
    fn open(&mut self, op: &str, tokens: &[&str]) {
        if self.json.is_empty() {
            // Room for an ordinary patch at once, rather than grown op by op.
            self.json.reserve(PATCH_BYTES);
            self.json.push(b'[');
        } else {
            self.json.push(b',');
        }
        self.json.extend_from_slice(b"{\"op\":\"");
        self.json.extend_from_slice(op.as_bytes());
        self.json.extend_from_slice(b"\",\"path\":");
        self.path.clear();
        for token in tokens {
            self.path.push('/');
            // RFC 6901: `~` is written `~0` and `/` is written `~1`. The text
            // between them is copied whole, not char by char: a profile under load
            // found the char-by-char loop at 1% of a review.
            let mut rest = *token;
            while let Some(at) = rest.find(['~', '/']) {
                self.path.push_str(&rest[..at]);
                self.path.push_str(if rest.as_bytes()[at] == b'~' {
                    "~0"
                } else {
                    "~1"
                });
                rest = &rest[at + 1..];
            }
            self.path.push_str(rest);
        }
        let path = std::mem::take(&mut self.path);
        self.write(path.as_str());
        self.path = path;
    }

    fn write<V: Serialize + ?Sized>(&mut self, value: &V) {
        if let Err(error) = serde_json::to_writer(&mut self.json, value) {
            self.failed.get_or_insert(error);
        }
    }

    /// The patch as JSON text, `None` when it has no operation; an error when a
    /// value could not be written (berth's own types always can).
    pub fn finish(mut self) -> Result<Option<Vec<u8>>, serde_json::Error> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        if self.json.is_empty() {
            return Ok(None);
        }
        self.json.push(b']');
        Ok(Some(self.json))
    }
}

/// What an ordinary patch of berth's takes as text, about: a toleration, a node
/// affinity and the applied annotation are 447 bytes for the benches' typical pod.
const PATCH_BYTES: usize = 512;

impl Ops for PatchText {
    fn add<V: Serialize + ?Sized>(&mut self, path: &[&str], value: &V) {
        self.open("add", path);
        self.json.extend_from_slice(b",\"value\":");
        self.write(value);
        self.json.push(b'}');
    }

    fn remove(&mut self, path: &[&str]) {
        self.open("remove", path);
        self.json.push(b'}');
    }
}

/// What berth wants in a list: each item's key (what it means to Kubernetes) and
/// the item, to compare with and write into the raw pod. The key comes from the
/// typed grant, not from JSON read back.
type Wanted<K, T> = Vec<(K, T)>;

fn wanted<T, K>(items: &[T], key: impl Fn(&T) -> K) -> Wanted<K, &T> {
    items.iter().map(|i| (key(i), i)).collect()
}

/// The operations that apply `grants` to `pod`; empty when the pod already is
/// what berth wants, or cannot be read (berth then refuses it).
pub fn build_patch<P: PodSource + ?Sized>(pod: &P, grants: &Grants) -> Patch {
    let mut ops = Vec::new();
    if let Ok(pod) = pod.view() {
        apply(&pod, grants, &mut ops);
    }
    Patch(ops)
}

/// What the patch adds to `pod` of `grants`, item by item, as [`build_patch`]
/// decides it: the rest the pod has already, or, for required expressions, its
/// required node affinity matches no node and stays so
/// ([`required_matches_no_node`]). `explain` marks what is new by it.
///
/// Each item is judged by the patch of that item alone, which adds it exactly
/// when the whole patch does: the builder compares each item with the pod, never
/// with the other grants, and a patch of no grants adds nothing.
pub fn added<P: PodSource + ?Sized>(pod: &P, grants: &Grants) -> Grants {
    let Ok(pod) = pod.view() else {
        return Grants::default();
    };
    // Whether the patch of only the grants `set` makes adds anything to the pod.
    let adds = |set: &dyn Fn(&mut Grants)| {
        let mut alone = Grants::default();
        set(&mut alone);
        let mut sink = AddsAnything(false);
        apply(&pod, &alone, &mut sink);
        sink.0
    };
    fn kept<T: Clone>(items: &[T], adds: impl Fn(&T) -> bool) -> Vec<T> {
        items.iter().filter(|i| adds(i)).cloned().collect()
    }
    Grants {
        tolerations: kept(&grants.tolerations, |t| {
            adds(&|g| g.tolerations = vec![t.clone()])
        }),
        required: kept(&grants.required, |r| {
            adds(&|g| g.required = vec![r.clone()])
        }),
        preferred: kept(&grants.preferred, |p| {
            adds(&|g| g.preferred = vec![p.clone()])
        }),
        scheduling_gates: kept(&grants.scheduling_gates, |n| {
            adds(&|g| g.scheduling_gates = vec![n.clone()])
        }),
        pod_group: (grants.pod_group.clone()).filter(|n| adds(&|g| g.pod_group = Some(n.clone()))),
        priority: (grants.priority.clone()).filter(|p| adds(&|g| g.priority = Some(p.clone()))),
        scheduler_name: (grants.scheduler_name.clone())
            .filter(|n| adds(&|g| g.scheduler_name = Some(n.clone()))),
        applied: if adds(&|g| g.applied = grants.applied.clone()) {
            grants.applied.clone()
        } else {
            Vec::new()
        },
        pinned_to: grants.pinned_to.clone(),
    }
}

/// A sink that only notes whether the patch adds anything.
struct AddsAnything(bool);

impl Ops for AddsAnything {
    fn add<V: Serialize + ?Sized>(&mut self, _: &[&str], _: &V) {
        self.0 = true;
    }

    fn remove(&mut self, _: &[&str]) {}
}

/// Whether the pod's required node affinity matches no node (it has no terms,
/// or only empty ones), so that berth adds none of its required expressions:
/// it never makes a pod placeable where Kubernetes would place it nowhere.
pub fn required_matches_no_node(pod: &PodObject) -> bool {
    pod.has(Part::RequiredNodeAffinity)
        && pod
            .required_term_list()
            .is_none_or(|terms| terms.iter().all(is_empty_term))
}

/// The same operations as [`build_patch`], written as JSON text.
pub fn write_patch(pod: &PodObject, grants: &Grants) -> PatchText {
    let mut text = PatchText::default();
    apply(pod, grants, &mut text);
    text
}

/// A scheduling gate as the pod lists it.
#[derive(Serialize)]
struct Gate<'a> {
    name: &'a str,
}

/// `spec.schedulingGroup`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SchedulingGroup<'a> {
    pod_group_name: &'a str,
}

/// A nodeSelectorTerm of berth's own, borrowed from the grants.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Term<'a> {
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    match_expressions: &'a [NodeSelectorRequirement],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    match_fields: &'a [NodeSelectorRequirement],
}

/// `value` inside one object per key of `keys`, outermost first: with keys `a`
/// and `b`, `{"a": {"b": value}}`.
struct Nested<'a, V: ?Sized> {
    keys: &'a [&'a str],
    value: &'a V,
}

impl<V: Serialize + ?Sized> Serialize for Nested<'_, V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some((key, keys)) = self.keys.split_first() else {
            return self.value.serialize(serializer);
        };
        let mut map = serializer.serialize_map(Some(1))?;
        let value = self.value;
        map.serialize_entry(key, &Nested { keys, value })?;
        map.end()
    }
}

fn apply<O: Ops>(pod: &PodObject, grants: &Grants, ops: &mut O) {
    let mut builder = Builder {
        pod,
        ops,
        created: Vec::new(),
    };
    builder.tolerations(wanted(&grants.tolerations, toleration_key));
    builder.pinned(grants.pinned_to.as_deref());
    builder.required(&grants.required, &grants.pin_fields());
    builder.preferred(wanted(&grants.preferred, preferred_key));
    builder.scheduler(grants.scheduler_name.as_deref());
    let gates = grants
        .scheduling_gates
        .iter()
        .map(|g| (g.as_str(), Gate { name: g }))
        .collect();
    builder.scheduling_gates(gates);
    builder.scheduling_group(grants.pod_group.as_deref());
    builder.priority(grants.priority.as_ref());
    builder.applied_annotation(&grants.applied);
}

struct Builder<'a, O> {
    pod: &'a PodObject,
    ops: &'a mut O,
    /// Objects this patch creates, so each is added once.
    created: Vec<Part>,
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    // Sized once for the tokens (escapes aside), rather than grown token by token:
    // the empty string always parses, as the root.
    let length = tokens.iter().map(|t| t.len() + 1).sum::<usize>();
    let mut path = PointerBuf::parse(String::with_capacity(length)).unwrap_or_default();
    for token in tokens {
        path.push_back(*token);
    }
    path
}

/// JSON Patch operations at the path of `tokens`, each token escaped as a JSON
/// Pointer needs: the one way berth writes a patch, in admission and in the
/// controller alike.
pub fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: pointer(tokens),
        value,
    })
}

pub fn remove(tokens: &[&str]) -> PatchOperation {
    PatchOperation::Remove(RemoveOperation {
        path: pointer(tokens),
    })
}

/// Fails the whole patch unless the value at `tokens` is `value`.
pub fn test(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: pointer(tokens),
        value,
    })
}

fn is_owned_preferred(term: &PreferredSchedulingTerm) -> bool {
    let expressions = term.preference.match_expressions.iter().flatten();
    expressions.into_iter().any(|e| is_owned_node_key(&e.key))
}

/// For a list where berth owns some items: the indices to remove (owned and no
/// longer wanted, or repeated) in descending order, and the wanted items missing.
/// Items are compared by `key`, so the cost grows with the list's length times
/// its logarithm, whatever a pod brings.
fn reconcile_list<T, K: Ord, W>(
    current: &[T],
    wanted: Wanted<K, W>,
    key: impl Fn(&T) -> K,
    owned: impl Fn(&T) -> bool,
) -> (Vec<usize>, Vec<W>) {
    let wanted_keys: BTreeSet<&K> = wanted.iter().map(|(k, _)| k).collect();
    let mut kept: BTreeSet<K> = BTreeSet::new();
    let mut remove = Vec::new();
    for (i, item) in current.iter().enumerate() {
        let item_key = key(item);
        if !owned(item) {
            kept.insert(item_key);
        } else if !wanted_keys.contains(&item_key) || !kept.insert(item_key) {
            // berth's, and no longer wanted or already kept once.
            remove.push(i);
        }
    }
    remove.reverse();
    let missing = wanted
        .into_iter()
        .filter_map(|(k, item)| kept.insert(k).then_some(item))
        .collect();
    (remove, missing)
}

impl<O: Ops> Builder<'_, O> {
    /// Adds `value` at `tail` inside `parent`. When `parent` or objects above it
    /// are missing (a `null` counts as missing), one operation adds the highest
    /// missing object with `value` nested in it, rather than an empty object per
    /// level and then the value: a shorter answer, and fewer operations for the
    /// apiserver to apply.
    fn add_in<V: Serialize + ?Sized>(&mut self, parent: Part, tail: &[&str], value: &V) {
        let mut top = None;
        let mut part = Some(parent);
        while let Some(missing) = part.filter(|p| !self.pod.has(*p) && !self.created.contains(p)) {
            self.created.push(missing);
            top = Some(missing);
            part = missing.parent();
        }
        let path = [parent.path(), tail].concat();
        let (at, keys) = path.split_at(top.map_or(path.len(), |t| t.path().len()));
        self.ops.add(at, &Nested { keys, value });
    }

    /// Adds the list `name` of `parent` when the pod has none (`current`), else
    /// reconciles it with the pod's ([`reconcile_list`]): berth's items it no
    /// longer wants go, and the wanted ones it lacks are appended.
    fn list<T, K: Ord, W: Serialize>(
        &mut self,
        (parent, name): (Part, &str),
        current: Option<&[T]>,
        wanted: Wanted<K, W>,
        key: impl Fn(&T) -> K,
        owned: impl Fn(&T) -> bool,
    ) {
        let Some(current) = current else {
            if !wanted.is_empty() {
                let items: Vec<W> = wanted.into_iter().map(|(_, item)| item).collect();
                self.add_in(parent, &[name], &items);
            }
            return;
        };
        let path = [parent.path(), &[name]].concat();
        let (remove, missing) = reconcile_list(current, wanted, key, owned);
        for i in remove {
            self.ops
                .remove(&[&path[..], &[i.to_string().as_str()]].concat());
        }
        let end = [&path[..], &["-"]].concat();
        for item in missing {
            self.ops.add(&end, &item);
        }
    }

    fn tolerations(&mut self, wanted: Wanted<TolerationKey, &Toleration>) {
        let current = self.pod.toleration_list();
        let list = (Part::Spec, "tolerations");
        self.list(list, current, wanted, toleration_key, is_owned_toleration);
    }

    /// A held pod that named its node loses the name ([`Grants::pinned_to`]).
    fn pinned(&mut self, node: Option<&str>) {
        if node.is_some() && self.pod.has_node_name() {
            self.ops.remove(&["spec", "nodeName"]);
        }
    }

    /// berth's required expressions (and the pin, a field requirement) ANDed into
    /// every term that matches something.
    fn required(&mut self, wanted: &[NodeSelectorRequirement], pin: &[NodeSelectorRequirement]) {
        let required = Part::RequiredNodeAffinity;
        // Only a pod without required node affinity (absent or `null`) gets a term
        // of its own. A `required` object with no terms matches no node, and the
        // apiserver refuses it: berth leaves it so rather than make it match.
        if !self.pod.has(required) {
            if !wanted.is_empty() || !pin.is_empty() {
                let term = Term {
                    match_expressions: wanted,
                    match_fields: pin,
                };
                self.add_in(required, &["nodeSelectorTerms"], &[term]);
            }
            return;
        }
        if required_matches_no_node(self.pod) {
            return;
        }
        let Some(terms) = self.pod.required_term_list() else {
            return;
        };
        let terms_path = [required.path(), &["nodeSelectorTerms"]].concat();
        for (t, term) in terms.iter().enumerate() {
            if is_empty_term(term) {
                // Matches no node; adding berth's expressions would make it match.
                continue;
            }
            let index = t.to_string();
            let term_path = [&terms_path[..], &[index.as_str()]].concat();
            let expressions = term.match_expressions.as_deref();
            self.add_missing(&term_path, "matchExpressions", expressions, wanted);
            self.add_missing(&term_path, "matchFields", term.match_fields.as_deref(), pin);
        }
    }

    /// Adds to the list `key` of the term at `term` the `wanted` requirements it
    /// lacks (`current`, `None` when the term has no such list).
    fn add_missing(
        &mut self,
        term: &[&str],
        key: &str,
        current: Option<&[NodeSelectorRequirement]>,
        wanted: &[NodeSelectorRequirement],
    ) {
        let path = [term, &[key]].concat();
        let mut present: BTreeSet<_> = current.into_iter().flatten().map(requirement_key).collect();
        let missing: Vec<&NodeSelectorRequirement> = wanted
            .iter()
            .filter(|r| present.insert(requirement_key(r)))
            .collect();
        if current.is_none() {
            if !missing.is_empty() {
                self.ops.add(&path, &missing);
            }
        } else {
            let end = [&path[..], &["-"]].concat();
            for item in missing {
                self.ops.add(&end, item);
            }
        }
    }

    fn preferred(&mut self, wanted: Wanted<PreferredKey, &PreferredSchedulingTerm>) {
        let current = self.pod.preferred_list();
        let list = (Part::NodeAffinity, PREFERRED);
        self.list(list, current, wanted, preferred_key, is_owned_preferred);
    }

    /// Scheduling gates can only be added at CREATE, which is when berth mutates.
    /// Every `berth.io/` gate is berth's: one the pod brings itself is removed.
    fn scheduling_gates(&mut self, wanted: Wanted<&str, Gate<'_>>) {
        let current = self.pod.gate_list();
        fn name<'g>(gate: &&'g str) -> &'g str {
            gate
        }
        let owned = |g: &&str| is_berth_gate(g);
        let list = (Part::Spec, "schedulingGates");
        self.list(list, current.as_deref(), wanted, name, owned);
    }

    /// `spec.schedulingGroup` can only be set at CREATE; berth sets it only on a
    /// pod that names no group itself.
    fn scheduling_group(&mut self, wanted: Option<&str>) {
        if let Some(name) = wanted
            && self.pod.pod_group_name() != Some(name)
        {
            let group = SchedulingGroup {
                pod_group_name: name,
            };
            self.add_in(Part::Spec, &["schedulingGroup"], &group);
        }
    }

    /// The PriorityClass, its value and `preemptionPolicy: Never` together: the
    /// apiserver's Priority plugin, run again after berth's patch, refuses a pod
    /// whose priority or preemption policy differs from its class.
    fn priority(&mut self, wanted: Option<&QueuePriority>) {
        let Some(wanted) = wanted else { return };
        let class = self.pod.priority_class_name().map(Value::from);
        let fields = [
            (
                "priorityClassName",
                Value::from(wanted.class.as_str()),
                class.as_ref(),
            ),
            ("priority", Value::from(wanted.value), self.pod.priority()),
            (
                "preemptionPolicy",
                Value::from("Never"),
                self.pod.preemption_policy(),
            ),
        ];
        for (field, value, current) in fields {
            if current != Some(&value) {
                self.add_in(Part::Spec, &[field], &value);
            }
        }
    }

    fn scheduler(&mut self, wanted: Option<&str>) {
        if let Some(name) = wanted
            && self.pod.scheduler_name() != Some(name)
        {
            self.add_in(Part::Spec, &["schedulerName"], name);
        }
    }

    fn applied_annotation(&mut self, applied: &[String]) {
        let path = ["metadata", "annotations", APPLIED_ANNOTATION];
        let current = self.pod.applied_record();
        if applied.is_empty() {
            if current.is_some() {
                self.ops.remove(&path);
            }
            return;
        }
        let value = applied.join(",");
        if current == Some(value.as_str()) {
            return;
        }
        self.add_in(Part::Annotations, &[APPLIED_ANNOTATION], value.as_str());
    }
}

/// `patch` moved under `prefix`, for a pod template inside another object.
pub fn nest(patch: Patch, prefix: &[&str]) -> Patch {
    let under = |path: &PointerBuf| {
        let mut nested = pointer(prefix);
        for token in path.tokens() {
            nested.push_back(token);
        }
        nested
    };
    Patch(
        patch
            .0
            .into_iter()
            .map(|op| match op {
                PatchOperation::Add(AddOperation { path, value }) => {
                    PatchOperation::Add(AddOperation {
                        path: under(&path),
                        value,
                    })
                }
                PatchOperation::Remove(RemoveOperation { path }) => {
                    PatchOperation::Remove(RemoveOperation { path: under(&path) })
                }
                other => other,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text's JSON Pointers escape as RFC 6901 says, as the operations' do.
    #[test]
    fn written_paths_escape_as_json_pointers() {
        let tokens = ["metadata", "annotations", "a~b/c~1\"d", "~/x/"];
        let mut text = PatchText::default();
        text.add(&tokens, "v");
        text.remove(&tokens);
        let json = text.finish().unwrap().unwrap();
        let written: Patch = serde_json::from_slice(&json).unwrap();
        let mut ops: Vec<PatchOperation> = Vec::new();
        Ops::add(&mut ops, &tokens, "v");
        Ops::remove(&mut ops, &tokens);
        assert_eq!(written, Patch(ops));
        assert_eq!(
            written.0[0].path().as_str(),
            "/metadata/annotations/a~0b~1c~01\"d/~0~1x~1"
        );
    }

    #[test]
    fn a_patch_without_operations_is_no_text() {
        assert!(PatchText::default().finish().unwrap().is_none());
    }
}
