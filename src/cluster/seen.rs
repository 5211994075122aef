//! Which watch events are changes: each kind's predicate hashes what berth reads
//! of an object, and an event that leaves the hash as it was wakes nothing. A
//! policy's status (berth's own write, every pass) and a DaemonSet's rollout
//! counters change resourceVersion, never what berth decides from.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use kube::Resource;
use kube::runtime::watcher::Event;
use kube::runtime::{Predicate, predicates};

use crate::objects::NodeObject;

/// What of a PlacementPolicy berth decides from: its spec (generation; deletion
/// bumps it too) and its finalizers. Not its status, which berth itself writes.
pub fn policy<K: Resource>(object: &K) -> Option<u64> {
    predicates::generation
        .combine(predicates::finalizers)
        .hash_property(object)
}

/// What of a Namespace berth decides from: the labels policies select by and the
/// annotations that opt in.
pub fn namespace<K: Resource>(object: &K) -> Option<u64> {
    predicates::labels
        .combine(predicates::annotations)
        .hash_property(object)
}

/// What of a DaemonSet berth decides from: its template (generation).
pub fn daemonset<K: Resource>(object: &K) -> Option<u64> {
    predicates::generation.hash_property(object)
}

/// What berth reads of a node: its labels, taints, allocatable and whether it is
/// being deleted. A kubelet's heartbeat (every node, every minute) changes none
/// of it.
pub fn node(node: &NodeObject) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    node.labels().hash(&mut hasher);
    node.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    for taint in &node.spec.taints {
        taint.to_string().hash(&mut hasher);
    }
    for (resource, amount) in &node.status.allocatable {
        (resource, amount.to_bits()).hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// What an event changed, as far as berth reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Nothing berth reads.
    Nothing,
    /// The object named (created, changed, or deleted).
    Object(String),
    /// A new list is whole: anything may have changed (an object deleted while the
    /// watch was down is not in it).
    Relisted,
}

/// The hash of what berth read of each object at its last change, by the hash of
/// its namespace and name (16 bytes an object rather than two names). The names
/// are hashed with a key of this process's own, so a tenant cannot choose names
/// that share a slot with another's object (by chance, one pair in 2^64 would).
/// A new list builds a new table, which replaces the old one once
/// whole, so objects deleted while the watch was down are forgotten.
pub struct Hashes<K> {
    predicate: fn(&K) -> Option<u64>,
    names: RandomState,
    seen: HashMap<u64, u64>,
    relisting: Option<HashMap<u64, u64>>,
}

impl<K: Resource> Hashes<K> {
    pub fn new(predicate: fn(&K) -> Option<u64>) -> Self {
        Hashes {
            predicate,
            names: RandomState::new(),
            seen: HashMap::new(),
            relisting: None,
        }
    }

    fn key(&self, object: &K) -> u64 {
        let meta = object.meta();
        self.names
            .hash_one((meta.namespace.as_deref(), meta.name.as_deref()))
    }

    /// What `event` changed. An object whose predicate has no value (no
    /// generation, say) changes on every event.
    pub fn changed(&mut self, event: &Event<K>) -> Seen {
        let name = |object: &K| object.meta().name.clone().unwrap_or_default();
        match event {
            Event::Apply(object) => {
                let hash = (self.predicate)(object);
                let before = match hash {
                    Some(hash) => self.seen.insert(self.key(object), hash),
                    None => self.seen.remove(&self.key(object)),
                };
                if hash.is_some() && before == hash {
                    Seen::Nothing
                } else {
                    Seen::Object(name(object))
                }
            }
            Event::Delete(object) => {
                let key = self.key(object);
                self.seen.remove(&key);
                Seen::Object(name(object))
            }
            Event::Init => {
                self.relisting = Some(HashMap::new());
                Seen::Nothing
            }
            Event::InitApply(object) => {
                let key = self.key(object);
                if let (Some(building), Some(hash)) =
                    (self.relisting.as_mut(), (self.predicate)(object))
                {
                    building.insert(key, hash);
                }
                Seen::Nothing
            }
            Event::InitDone => {
                if let Some(built) = self.relisting.take() {
                    self.seen = built;
                }
                Seen::Relisted
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::PolicyObject;
    use serde_json::json;

    fn policy_object(generation: i64, finalizers: &[&str], status: &str) -> PolicyObject {
        serde_json::from_value(json!({
            "metadata": {"name": "cdn", "generation": generation, "finalizers": finalizers,
                         "resourceVersion": status},
            "spec": {"nodeNames": ["node2"]},
            "status": {"nodes": status.len()}}))
        .unwrap()
    }

    fn node_object(version: &str, zone: &str, taints: serde_json::Value) -> NodeObject {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "resourceVersion": version, "labels": {"zone": zone}},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready"}]}}))
        .unwrap()
    }

    #[test]
    fn a_status_write_is_no_change_a_spec_or_finalizer_change_is() {
        let mut hashes = Hashes::new(policy::<PolicyObject>);
        let seen = |h: &mut Hashes<PolicyObject>, p| h.changed(&Event::Apply(p));
        assert_eq!(
            seen(&mut hashes, policy_object(1, &[], "1")),
            Seen::Object("cdn".into()),
            "first seen"
        );
        assert_eq!(
            seen(&mut hashes, policy_object(1, &[], "22")),
            Seen::Nothing,
            "status"
        );
        assert_eq!(
            seen(&mut hashes, policy_object(1, &["berth.io/nodes"], "3")),
            Seen::Object("cdn".into()),
            "finalizer"
        );
        assert_eq!(
            seen(&mut hashes, policy_object(2, &["berth.io/nodes"], "4")),
            Seen::Object("cdn".into()),
            "spec"
        );
        let deleted = Event::Delete(policy_object(2, &["berth.io/nodes"], "5"));
        assert_eq!(hashes.changed(&deleted), Seen::Object("cdn".into()));
    }

    #[test]
    fn a_new_list_forgets_what_it_does_not_hold() {
        let mut hashes = Hashes::new(policy::<PolicyObject>);
        hashes.changed(&Event::Apply(policy_object(1, &[], "1")));
        assert_eq!(hashes.changed(&Event::Init), Seen::Nothing);
        assert_eq!(hashes.changed(&Event::InitDone), Seen::Relisted);
        assert_eq!(
            hashes.changed(&Event::Apply(policy_object(1, &[], "2"))),
            Seen::Object("cdn".into()),
            "gone from the list, so new again"
        );
    }

    #[test]
    fn a_heartbeat_wakes_nothing_a_label_or_taint_does() {
        let before = node(&node_object("1", "a", json!([])));
        assert_eq!(before, node(&node_object("2", "a", json!([]))), "heartbeat");
        assert_ne!(before, node(&node_object("3", "b", json!([]))), "label");
        let tainted = json!([{"key": "k", "effect": "NoSchedule"}]);
        assert_ne!(before, node(&node_object("4", "a", tainted)), "taint");
    }
}
