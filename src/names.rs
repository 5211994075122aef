//! The names berth owns, from SPEC "Names". Everything that writes or recognises one
//! of these keys refers to this module, so a key cannot drift between the webhook
//! and the controller.

/// API group of the `PlacementPolicy` CRD.
pub const GROUP: &str = "berth.io";
/// Label on pool nodes: `node-restriction.kubernetes.io/berth.pool: <policy>`.
///
/// The `node-restriction.kubernetes.io/` prefix is deliberate: with the
/// NodeRestriction admission plugin a kubelet cannot set it on its own Node, so a
/// compromised node cannot make itself a member of a pool.
pub const POOL_LABEL: &str = "node-restriction.kubernetes.io/berth.pool";
/// Prefix of anchor labels: `node-restriction.kubernetes.io/berth.runs.<policy>: "true"`,
/// on nodes where a pod that the policy's `colocateWith` or `avoid` names runs.
pub const ANCHOR_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/berth.runs.";
/// Prefix of placed labels: `node-restriction.kubernetes.io/berth.placed.<policy>: "true"`,
/// on nodes where a pod of an `avoid` policy runs. Pods that policy avoids keep off
/// them, so that `avoid` is symmetric as required anti-affinity is.
pub const PLACED_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/berth.placed.";
/// Finalizer on every policy: a deleted policy's labels and taints are cleaned
/// from its nodes before it goes.
pub const POLICY_FINALIZER: &str = "berth.io/cleanup";
/// Taint key on dedicated pool nodes: `berth.io/pool=<policy>:NoSchedule`.
pub const POOL_TAINT: &str = "berth.io/pool";
/// Namespace annotation that opts a namespace into policies: `"cdn, gpu"`.
pub const POLICIES_ANNOTATION: &str = "berth.io/policies";
/// Prefix of the per-namespace image override: `berth.io/images.<policy>`.
pub const IMAGES_ANNOTATION_PREFIX: &str = "berth.io/images.";
/// Namespace annotation that routes all its pods to a scheduler.
pub const SCHEDULER_ANNOTATION: &str = "berth.io/scheduler-name";
/// Annotation berth writes on a mutated pod: the applied policies, sorted.
pub const APPLIED_ANNOTATION: &str = "berth.io/applied";
/// The annotation of the PlacementPolicy the controller creates as a dry run to
/// learn whether the apiserver reaches the webhook: `/validate` refuses every
/// policy that carries it, with [`WEBHOOK_PROBE_ANSWER`].
pub const WEBHOOK_PROBE_ANNOTATION: &str = "berth.io/webhook-probe";
/// What `/validate` answers a webhook probe: the probe's proof that it was heard.
pub const WEBHOOK_PROBE_ANSWER: &str = "berth's webhook answers";
/// Scheduling gate on pods of `avoid` policies, removed by the controller when the
/// pod may be placed without racing another pod it must avoid.
pub const AVOID_GATE: &str = "berth.io/avoid";
/// Scheduling gate on members of a gang (gate mode), removed from every member of a
/// group together once the group is complete and fits.
pub const GANG_GATE: &str = "berth.io/gang";
/// Scheduling gate on ranked pods, removed once every lower rank is Ready.
pub const RANK_GATE: &str = "berth.io/rank";
/// Prefix of the PriorityClasses berth keeps for queue order:
/// `berth-queue-<policy>-<value>`.
pub const QUEUE_CLASS_PREFIX: &str = "berth-queue-";
/// Prefix of the PodGroups berth keeps for gangs: `berth-<group>-<hash>`. Only
/// berth writes PodGroups so named (the admission policy `berth-podgroups`).
pub const POD_GROUP_PREFIX: &str = "berth-";
/// The gates of groups (SPEC "Groups"), which hold a pod before the avoid gate.
pub const GROUP_GATES: [&str; 2] = [GANG_GATE, RANK_GATE];
/// The metadata of an object berth creates (a queue PriorityClass, a PodGroup):
/// its name and berth's managed-by label, which the controller's sweep lists by.
pub fn owned_metadata(name: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(std::collections::BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            FIELD_MANAGER.to_owned(),
        )])),
        ..Default::default()
    }
}

/// Label on the objects berth creates (PriorityClasses, PodGroups).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Scheduling gates whose name starts with this are berth's: only berth's own
/// ServiceAccount may remove them.
pub const GATE_PREFIX: &str = "berth.io/";
/// Who the DaemonSet controller is in `request.userInfo.username`: its own
/// ServiceAccount when kube-controller-manager runs with
/// `--use-service-account-credentials` (the usual set-up), else the
/// controller-manager's identity. A pod is a DaemonSet pod only when one of them
/// created it; an ownerReference alone is something any user can write.
pub const DAEMONSET_CONTROLLER_USERS: [&str; 2] = [
    "system:serviceaccount:kube-system:daemon-set-controller",
    "system:kube-controller-manager",
];
/// berth's own identity as `manifests/` installs it: the ServiceAccount
/// `berth-system/berth`.
pub const BERTH_SERVICE_ACCOUNT: &str = "system:serviceaccount:berth-system:berth";
/// The label the apiserver puts on every namespace, holding its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Namespaces whose DaemonSets a pool takes when it names none
/// (`daemonSetNamespaces` absent): the system's node agents (kube-proxy, the CNI).
pub const SYSTEM_DAEMONSET_NAMESPACES: [&str; 1] = ["kube-system"];
/// The MutatingAdmissionPolicy that places pods with berth down
/// (`crate::admission::static_cel`), as status and `explain` name it.
pub const PLACEMENT_POLICY: &str = "berth-placement";
/// Field manager for every write berth makes.
pub const FIELD_MANAGER: &str = "berth";
/// Policy names feed label keys, whose name part is at most 63 characters
/// (`berth.placed.` and 50 characters make 63).
pub const MAX_POLICY_NAME: usize = 50;

/// The anchor label key of `policy`.
pub fn anchor_label(policy: &str) -> String {
    format!("{ANCHOR_LABEL_PREFIX}{policy}")
}

/// The placed label key of `policy`.
pub fn placed_label(policy: &str) -> String {
    format!("{PLACED_LABEL_PREFIX}{policy}")
}

/// Whether a node label or node-affinity expression key is one berth derives itself.
pub fn is_owned_node_key(key: &str) -> bool {
    key == POOL_LABEL
        || key.starts_with(ANCHOR_LABEL_PREFIX)
        || key.starts_with(PLACED_LABEL_PREFIX)
}

/// The policy a berth node label belongs to: the pool label's value, or the
/// policy part of an anchor or placed label.
pub fn policy_of_node_label<'a>(key: &'a str, value: &'a str) -> Option<&'a str> {
    if key == POOL_LABEL {
        return Some(value);
    }
    key.strip_prefix(ANCHOR_LABEL_PREFIX)
        .or_else(|| key.strip_prefix(PLACED_LABEL_PREFIX))
}

/// Whether a scheduling gate is one of berth's.
pub fn is_berth_gate(name: &str) -> bool {
    name.starts_with(GATE_PREFIX)
}

/// The PriorityClass of `policy`'s queue value `value`. One set per policy, so
/// that an admission policy can keep each set to the namespaces that opt into its
/// policy.
pub fn queue_class(policy: &str, value: i32) -> String {
    format!("{QUEUE_CLASS_PREFIX}{policy}-{value}")
}

/// The policy and queue value a `berth-queue-<policy>-<value>` name stands for.
/// Only the canonical spelling of the value (`7`, never `07` or `+7`) is berth's.
pub fn queue_class_parts(name: &str) -> Option<(&str, i32)> {
    let (policy, value) = name.strip_prefix(QUEUE_CLASS_PREFIX)?.rsplit_once('-')?;
    let parsed = value.parse::<i32>().ok()?;
    (parsed.to_string() == value && parsed >= 0 && is_valid_policy_name(policy))
        .then_some((policy, parsed))
}

/// Whether `key` is a Kubernetes label key: an optional DNS subdomain prefix and
/// `/`, then a name of at most 63 alphanumerics, `-`, `_` or `.`, starting and
/// ending alphanumeric.
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

/// Whether `value` is a Kubernetes label value: empty, or at most 63
/// alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.is_empty()
        || (bytes.len() <= 63
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// Whether `username` is the DaemonSet controller.
pub fn is_daemonset_controller(username: &str) -> bool {
    DAEMONSET_CONTROLLER_USERS.contains(&username)
}

/// Whether `name` can be a policy name: a DNS-1123 subdomain (what Kubernetes
/// allows as an object name) of at most [`MAX_POLICY_NAME`] characters, so that
/// `berth.runs.<policy>` stays a valid label name.
pub fn is_valid_policy_name(name: &str) -> bool {
    name.len() <= MAX_POLICY_NAME && is_dns_subdomain(name)
}

/// Whether `name` is a DNS-1123 subdomain: at most 253 characters, labels of
/// lowercase alphanumerics and `-` joined by `.`, each label starting and ending
/// alphanumeric.
pub fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && alnum(bytes[0])
                && alnum(bytes[bytes.len() - 1])
                && bytes.iter().all(|&c| alnum(c) || c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_short_dns_subdomains() {
        assert!(is_valid_policy_name("cdn"));
        assert!(is_valid_policy_name("redis-master.v2"));
        assert!(is_valid_policy_name(&"a".repeat(50)));
        assert!(!is_valid_policy_name(&"a".repeat(51)));
        for bad in [
            "", "CDN", "-cdn", "cdn-", "cdn_x", "cdn gpu", "cdn/x", "a..b", "a.-b", "a-.b", ".a",
        ] {
            assert!(!is_valid_policy_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn label_keys_have_an_optional_prefix_and_a_short_name() {
        for good in [
            "podGroup",
            "berth.io/rank",
            "a",
            "x_y.z-1",
            "example.com/A9",
        ] {
            assert!(is_label_key(good), "{good:?}");
        }
        for bad in [
            "",
            "/x",
            "berth.io/",
            "-x",
            "x-",
            "a/b/c",
            "Ex.com/x",
            "a..b/x",
            &"a".repeat(64),
        ] {
            assert!(!is_label_key(bad), "{bad:?}");
        }
        assert!(is_label_value("") && is_label_value("A-1_b.2"));
        for bad in ["-a", "a-", "a b", "+5", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn owned_node_keys_are_the_pool_and_anchor_labels() {
        assert!(is_owned_node_key(POOL_LABEL));
        assert!(is_owned_node_key(&anchor_label("redis")));
        assert!(is_owned_node_key(&placed_label("redis")));
        assert_eq!(
            policy_of_node_label(&placed_label("redis"), "true"),
            Some("redis")
        );
        assert_eq!(policy_of_node_label(POOL_LABEL, "cdn"), Some("cdn"));
        assert!(!is_owned_node_key("kubernetes.io/hostname"));
        assert!(!is_owned_node_key("node-restriction.kubernetes.io/other"));
    }
}
