//! The queue PriorityClasses (SPEC "Groups"): for every policy with `queue` in
//! force, the controller keeps a class `berth-queue-<policy>-<value>` for each value
//! a pod of that policy may get, so the webhook only names classes that exist and
//! writes nothing on behalf of a review. The sweep ([`super::sweep`]) deletes the
//! classes no policy allows once no pod of a namespace that opts into the class's
//! policy uses them.

use super::writes::{Kind, Writes};
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::names::{FIELD_MANAGER, owned_metadata, queue_class};
use crate::policy::PolicySet;

/// The class berth keeps for `value`: it orders the queue and never preempts.
pub fn class_object(class: &str, value: i32) -> PriorityClass {
    PriorityClass {
        metadata: owned_metadata(class),
        value: Some(value),
        preemption_policy: Some("Never".into()),
        global_default: Some(false),
        description: Some(
            "berth queue order: 3 x the pod's queue priority label (at most the policy's \
             maxPriority) + its QoS rank; never preempts"
                .into(),
        ),
    }
}

/// The classes the policies in force allow: name and value.
pub fn wanted(policies: &PolicySet) -> BTreeMap<String, i32> {
    policies
        .iter()
        .filter_map(|p| Some((p, p.spec.queue.as_ref()?)))
        .flat_map(|(policy, queue)| {
            queue
                .class_values()
                .map(|value| (queue_class(&policy.name, value), value))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The classes known to exist, since this replica leads.
#[derive(Debug, Default)]
pub struct QueueClasses {
    known: BTreeSet<String>,
}

impl QueueClasses {
    /// Makes every class of `wanted` not known to exist, within the write rate. A
    /// class that fails is tried again at the next pass.
    pub async fn keep(&mut self, writes: &Writes, client: &Client, wanted: &BTreeMap<String, i32>) {
        let api: Api<PriorityClass> = Api::all(client.clone());
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let missing: Vec<(&String, &i32)> = wanted
            .iter()
            .filter(|(c, _)| !self.known.contains(*c))
            .collect();
        for (class, value) in missing {
            match writes
                .make(
                    Kind::PriorityClass,
                    api.create(&params, &class_object(class, *value)),
                )
                .await
            {
                Ok(_) => tracing::info!(%class, value, "made queue PriorityClass"),
                Err(e) if e.status() == Some(409) => {}
                Err(e) => {
                    tracing::warn!(%class, error = %e, "cannot make queue PriorityClass; trying at the next pass");
                    continue;
                }
            }
            self.known.insert(class.clone());
        }
        // A class deleted by someone else is made again after the next resync.
        self.known.retain(|c| wanted.contains_key(c));
    }

    /// Forgets what is known: at a resync, so that a class deleted behind berth's
    /// back is made again.
    pub fn forget(&mut self) {
        self.known.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_policies;
    use serde_json::json;

    #[test]
    fn each_queue_policy_has_a_class_for_every_value_its_pods_may_get() {
        let set = test_policies(&[
            ("jobs", json!({"queue": {"maxPriority": 2}})),
            (
                "flat",
                json!({"queue": {"maxPriority": 1, "qosTieBreak": false}}),
            ),
            ("cdn", json!({"pool": {"nodeNames": ["node2"]}})),
        ]);
        let wanted = wanted(&set);
        assert_eq!(wanted.len(), 9 + 2);
        assert_eq!(wanted["berth-queue-jobs-8"], 8);
        assert_eq!(wanted["berth-queue-flat-3"], 3);
        assert!(!wanted.contains_key("berth-queue-flat-1"), "no QoS ranks");
    }
}
