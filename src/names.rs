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
/// Prefix of anchor labels: `node-restriction.kubernetes.io/berth.runs.<policy>: "true"`.
pub const ANCHOR_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/berth.runs.";
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
/// Scheduling gate on pods of `avoid` policies, removed by the controller when the
/// pod may be placed without racing another pod it must avoid.
pub const AVOID_GATE: &str = "berth.io/avoid";
/// Field manager for every write berth makes.
pub const FIELD_MANAGER: &str = "berth";
/// Policy names feed label keys, whose name part is at most 63 characters.
pub const MAX_POLICY_NAME: usize = 50;

/// The anchor label key of `policy`.
pub fn anchor_label(policy: &str) -> String {
    format!("{ANCHOR_LABEL_PREFIX}{policy}")
}

/// Whether a node-affinity expression key is one berth derives itself.
pub fn is_owned_node_key(key: &str) -> bool {
    key == POOL_LABEL || key.starts_with(ANCHOR_LABEL_PREFIX)
}

/// Whether `name` can be a policy name: a DNS-1123 subdomain (what Kubernetes
/// allows as an object name) of at most [`MAX_POLICY_NAME`] characters, so that
/// `berth.runs.<policy>` stays a valid label name.
pub fn is_valid_policy_name(name: &str) -> bool {
    name.len() <= MAX_POLICY_NAME && is_dns_subdomain(name)
}

/// Whether `name` is a DNS-1123 subdomain: lowercase alphanumerics, `-` and `.`,
/// starting and ending alphanumeric, at most 253 characters.
pub fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1])
        && bytes.iter().all(|&c| alnum(c) || c == b'-' || c == b'.')
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
        for bad in ["", "CDN", "-cdn", "cdn-", "cdn_x", "cdn gpu", "cdn/x"] {
            assert!(!is_valid_policy_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn owned_node_keys_are_the_pool_and_anchor_labels() {
        assert!(is_owned_node_key(POOL_LABEL));
        assert!(is_owned_node_key(&anchor_label("redis")));
        assert!(!is_owned_node_key("kubernetes.io/hostname"));
        assert!(!is_owned_node_key("node-restriction.kubernetes.io/other"));
    }
}
