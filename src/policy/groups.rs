//! What the group fields of a policy (SPEC "Groups") read from a pod's labels: its
//! gang and the gang's size, its rank, its queue priority. The webhook and the
//! controller both read pods through these, so they can never disagree on who is
//! in which group.

use super::compile::Labels;
use super::crd::{Gang, Queue, StartOrder};
use crate::names::{POD_GROUP_PREFIX, is_dns_subdomain};

/// The largest `minAvailable` berth accepts: a bound on what one group may hold.
pub const MAX_GANG_SIZE: u32 = 10_000;
/// The highest queue priority label berth reads as a number; a policy's
/// `maxPriority` then caps what counts.
pub const MAX_QUEUE_PRIORITY: i32 = 1_000_000;
/// Pod labels that name the revision of the pod's template: a rollout of a
/// Deployment, StatefulSet or Job makes new pods that must not join the old group.
const REVISION_LABELS: [&str; 3] = [
    "pod-template-hash",
    "controller-revision-hash",
    "batch.kubernetes.io/controller-uid",
];

/// A pod's place in a gang.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GangMember {
    /// The group label's value.
    pub group: String,
    /// The template revision the pod was made from, if its owner says.
    pub revision: Option<String>,
    /// `minAvailable`: how many members must exist before any is placed.
    pub min_available: u32,
}

impl Gang {
    /// The pod's gang: `None` when it has no group label (it is no member), an
    /// error when it has one but no usable size.
    pub fn member(&self, labels: &Labels) -> Result<Option<GangMember>, String> {
        let Some(group) = labels.get(&self.group_label) else {
            return Ok(None);
        };
        let size = labels.get(&self.min_available_label).ok_or_else(|| {
            format!(
                "gang {group}: label {} (the group's size) is missing",
                self.min_available_label
            )
        })?;
        let min_available = size
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_GANG_SIZE).contains(n))
            .ok_or_else(|| {
                format!(
                    "gang {group}: {}={size:?} is not a whole number from 1 to {MAX_GANG_SIZE}",
                    self.min_available_label
                )
            })?;
        let revision = REVISION_LABELS
            .iter()
            .find_map(|key| labels.get(*key))
            .cloned();
        Ok(Some(GangMember {
            group: group.clone(),
            revision,
            min_available,
        }))
    }
}

impl GangMember {
    /// The name of the Kubernetes PodGroup for this member of `policy`'s gang: a
    /// readable part, and a hash of the exact policy, group and revision (label
    /// values may hold capitals and `_`, which names may not).
    pub fn pod_group_name(&self, policy: &str) -> String {
        let revision = self.revision.as_deref().unwrap_or_default();
        let readable: String = self
            .group
            .chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '-') => c,
                _ => '-',
            })
            .take(40)
            .collect();
        let hash = fnv1a(&[policy, &self.group, revision]);
        let name = format!(
            "{POD_GROUP_PREFIX}{}-{hash:016x}",
            readable.trim_matches('-')
        );
        if is_dns_subdomain(&name) {
            name
        } else {
            format!("{POD_GROUP_PREFIX}{hash:016x}")
        }
    }
}

/// FNV-1a over the parts, each ended by a 0 byte so that ("ab", "c") and ("a",
/// "bc") differ. Stable across berth versions and machines, unlike std's hasher.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

impl StartOrder {
    /// The pod's rank: `None` without the label, an error when it is not an integer.
    pub fn rank(&self, labels: &Labels) -> Result<Option<i32>, String> {
        labels
            .get(&self.rank_label)
            .map(|value| {
                value
                    .parse::<i32>()
                    .map_err(|_| format!("{}={value:?} is not an integer rank", self.rank_label))
            })
            .transpose()
    }
}

/// A pod's Quality of Service class, as Kubernetes computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QosClass {
    BestEffort = 0,
    Burstable = 1,
    Guaranteed = 2,
}

impl Queue {
    /// The pod's queue priority label: `None` without it, an error when it is not
    /// a whole number from 0 to [`MAX_QUEUE_PRIORITY`].
    pub fn priority(&self, labels: &Labels) -> Result<Option<i32>, String> {
        labels
            .get(&self.priority_label)
            .map(|value| {
                value
                    .parse::<i32>()
                    .ok()
                    .filter(|p| (0..=MAX_QUEUE_PRIORITY).contains(p))
                    .ok_or_else(|| {
                        format!(
                            "{}={value:?} is not a whole number from 0 to {MAX_QUEUE_PRIORITY}",
                            self.priority_label
                        )
                    })
            })
            .transpose()
    }

    /// The PriorityClass value of a pod with `priority` (at most `maxPriority`
    /// counts) and `qos`: three values per priority, so that with `qosTieBreak` a
    /// better QoS class is scheduled first among equals and never ahead of a higher
    /// priority.
    pub fn class_value(&self, priority: i32, qos: QosClass) -> i32 {
        let tie = if self.qos_tie_break { qos as i32 } else { 0 };
        priority.min(self.max_priority) * 3 + tie
    }

    /// Every class value a pod of this policy may get: the classes the controller
    /// keeps for it.
    pub fn class_values(&self) -> impl Iterator<Item = i32> + '_ {
        const QOS: [QosClass; 3] = [
            QosClass::BestEffort,
            QosClass::Burstable,
            QosClass::Guaranteed,
        ];
        let ties = if self.qos_tie_break {
            &QOS[..]
        } else {
            &QOS[..1]
        };
        (0..=self.max_priority.max(0))
            .flat_map(move |p| ties.iter().map(move |q| self.class_value(p, *q)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{queue_class, queue_class_parts};

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_gang_member_needs_a_group_and_a_size() {
        let gang = Gang::default();
        assert_eq!(gang.member(&labels(&[("app", "x")])), Ok(None));
        let member = gang
            .member(&labels(&[("podGroup", "train"), ("minAvailable", "3")]))
            .unwrap()
            .unwrap();
        assert_eq!((member.group.as_str(), member.min_available), ("train", 3));
        for bad in ["0", "-1", "three", "10001", ""] {
            let error = gang
                .member(&labels(&[("podGroup", "train"), ("minAvailable", bad)]))
                .unwrap_err();
            assert!(error.contains("minAvailable"), "{error}");
        }
        let error = gang.member(&labels(&[("podGroup", "train")])).unwrap_err();
        assert!(error.contains("missing"), "{error}");
    }

    #[test]
    fn a_rollout_makes_a_new_pod_group_and_names_are_valid() {
        let gang = Gang::default();
        let member = |rev: &str| {
            gang.member(&labels(&[
                ("podGroup", "Train_Job.A"),
                ("minAvailable", "2"),
                ("pod-template-hash", rev),
            ]))
            .unwrap()
            .unwrap()
        };
        let (old, new) = (member("5d8f"), member("77c4"));
        assert_ne!(old.pod_group_name("ml"), new.pod_group_name("ml"));
        assert_eq!(
            old.pod_group_name("ml"),
            member("5d8f").pod_group_name("ml")
        );
        assert_ne!(old.pod_group_name("ml"), old.pod_group_name("ml2"));
        let name = old.pod_group_name("ml");
        assert!(name.starts_with("berth-train-job-a-"), "{name}");
        assert!(is_dns_subdomain(&name), "{name}");
        // Case matters in label values, so it does in group identity.
        let upper = GangMember {
            group: "A".into(),
            revision: None,
            min_available: 1,
        };
        let lower = GangMember {
            group: "a".into(),
            ..upper.clone()
        };
        assert_ne!(upper.pod_group_name("p"), lower.pod_group_name("p"));
        let dots = GangMember {
            group: "...".into(),
            ..upper
        };
        assert!(is_dns_subdomain(&dots.pod_group_name("p")));
    }

    #[test]
    fn ranks_and_priorities_are_bounded_integers() {
        let order = StartOrder::default();
        assert_eq!(order.rank(&labels(&[("berth.io/rank", "2")])), Ok(Some(2)));
        assert_eq!(order.rank(&labels(&[])), Ok(None));
        assert!(order.rank(&labels(&[("berth.io/rank", "2.5")])).is_err());
        let queue = Queue::default();
        assert_eq!(
            queue.priority(&labels(&[("groupPriority", "10")])),
            Ok(Some(10))
        );
        for bad in ["-1", "1000001", "high"] {
            assert!(queue.priority(&labels(&[("groupPriority", bad)])).is_err());
        }
    }

    #[test]
    fn queue_values_order_priority_first_then_qos() {
        let queue = Queue::default();
        let value = |p, q| queue.class_value(p, q);
        assert!(value(2, QosClass::BestEffort) > value(1, QosClass::Guaranteed));
        assert!(value(1, QosClass::Guaranteed) > value(1, QosClass::Burstable));
        assert!(value(1, QosClass::Burstable) > value(1, QosClass::BestEffort));
        let flat = Queue {
            qos_tie_break: false,
            ..Queue::default()
        };
        assert_eq!(
            flat.class_value(1, QosClass::Guaranteed),
            flat.class_value(1, QosClass::BestEffort)
        );
        assert_eq!(
            queue_class_parts(&queue_class("a-b.c", 31)),
            Some(("a-b.c", 31))
        );
        for bad in [
            "berth-queue-q-07",
            "berth-queue-q-+7",
            "berth-queue-q--1",
            "berth-queue-7",
            "berth-queue-Q-7",
            "other-q-7",
        ] {
            assert_eq!(queue_class_parts(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_priority_above_the_policys_ceiling_counts_as_the_ceiling() {
        let queue = Queue {
            max_priority: 4,
            ..Queue::default()
        };
        assert_eq!(
            queue.class_value(1_000_000, QosClass::Guaranteed),
            queue.class_value(4, QosClass::Guaranteed)
        );
        let values: Vec<i32> = queue.class_values().collect();
        assert_eq!(values.len(), 15, "three QoS ranks for each of 0..=4");
        assert_eq!(values.iter().max(), Some(&14));
        let flat = Queue {
            qos_tie_break: false,
            ..queue
        };
        assert_eq!(
            flat.class_values().collect::<Vec<_>>(),
            vec![0, 3, 6, 9, 12]
        );
    }
}
