//! What only berth may change on a pod that exists (SPEC "Enforcement that holds
//! while berth is down"): its record `berth.io/applied`, which the controller reads
//! for entitlement, anchors and exclusion; its `berth.io/` scheduling gates, which
//! hold it until the controller has narrowed where it may go; and who controls it
//! (controller ownerReferences), which decides whether it is a DaemonSet pod.
//! And what a record must come with at CREATE: a pod whose `berth.io/applied`
//! names an `avoid` policy carries `berth.io/avoid`, as berth always gives it, so
//! a record written while berth is down cannot skip the hold that keeps it apart.
//!
//! Kubernetes' own controllers adopt and orphan pods (a ReplicaSet adopts a
//! matching pod, the garbage collector orphans them), so they may change controller
//! ownerReferences too. The same rules run in the apiserver as CEL, with berth
//! down (see [`crate::admission::cel`]).

use super::opt_in::applied_names;
use super::pod::Requester;
use crate::names::{APPLIED_ANNOTATION, AVOID_GATE, is_berth_gate};
use crate::objects::PodObject;
use crate::policy::PolicySet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// Whether `username` is one of kube-controller-manager's controllers.
pub fn is_kube_controller(username: &str) -> bool {
    username.starts_with("system:serviceaccount:kube-system:")
        || username == "system:kube-controller-manager"
}

/// The changes from `old` to `new` that `username` may not make; empty when the
/// update may go on. `berth` is berth's own identity, which may make them all.
pub fn forbidden_changes(
    old: &PodObject,
    new: &PodObject,
    username: &str,
    berth: &str,
) -> Vec<String> {
    let mut forbidden = Vec::new();
    if username == berth {
        return forbidden;
    }
    if old.applied_record() != new.applied_record() {
        forbidden.push(format!(
            "{APPLIED_ANNOTATION} is berth's record of what it applied; only berth sets it"
        ));
    }
    for gate in old.scheduling_gates().filter(|g| is_berth_gate(g)) {
        if !new.scheduling_gates().any(|g| g == gate) {
            forbidden.push(format!(
                "the scheduling gate {gate} is berth's; only berth removes it"
            ));
        }
    }
    let controllers = |p: &PodObject| p.controllers().cloned().collect::<Vec<OwnerReference>>();
    if !is_kube_controller(username) && controllers(old) != controllers(new) {
        forbidden.push(
            "a pod's controller ownerReference is set by its controller, not changed afterwards"
                .into(),
        );
    }
    forbidden
}

/// Why a pod created by `requester` may not be: its `berth.io/applied` names an
/// `avoid` policy but it does not carry the gate `berth.io/avoid`. DaemonSet pods
/// are never held. The admission policy `berth-holds` runs the same rule.
pub fn unheld_record(
    pod: &PodObject,
    requester: Requester,
    policies: &PolicySet,
) -> Option<String> {
    if pod.is_daemonset_pod(requester) || pod.scheduling_gates().any(|g| g == AVOID_GATE) {
        return None;
    }
    let policy = applied_names(pod.applied_record())
        .into_iter()
        .find(|name| policies.get(name).is_some_and(|p| p.spec.avoid.is_some()))?;
    Some(format!(
        "{APPLIED_ANNOTATION} names policy {policy}, which holds its pods with the scheduling \
         gate {AVOID_GATE}; the pod does not carry it (only berth writes the record)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(applied: &str, gates: &[&str], owner: Option<&str>) -> PodObject {
        let owners: Vec<_> = owner
            .map(|kind| json!({"apiVersion": "apps/v1", "kind": kind, "name": "x", "uid": "u", "controller": true}))
            .into_iter()
            .collect();
        let gates: Vec<_> = gates.iter().map(|g| json!({"name": g})).collect();
        PodObject::read(&json!({"kind": "Pod",
            "metadata": {"annotations": {"berth.io/applied": applied}, "ownerReferences": owners},
            "spec": {"schedulingGates": gates}}))
        .unwrap()
    }

    const BERTH: &str = "system:serviceaccount:berth-system:berth";

    #[test]
    fn a_tenant_may_not_forge_berths_record_gates_or_controller() {
        let old = pod("", &["berth.io/avoid", "mine"], None);
        assert!(
            forbidden_changes(&old, &pod("", &["berth.io/avoid"], None), "tenant", BERTH)
                .is_empty()
        );
        let forged = forbidden_changes(
            &old,
            &pod("cdn", &["mine"], Some("DaemonSet")),
            "tenant",
            BERTH,
        );
        assert_eq!(forged.len(), 3, "{forged:?}");
        assert!(forged[0].contains("berth.io/applied"));
        assert!(forged[1].contains("berth.io/avoid"));
        assert!(forged[2].contains("ownerReference"));
    }

    #[test]
    fn berth_releases_and_kubernetes_controllers_adopt() {
        let old = pod("masters", &["berth.io/avoid"], None);
        assert!(forbidden_changes(&old, &pod("masters", &[], None), BERTH, BERTH).is_empty());
        let adopter = "system:serviceaccount:kube-system:replicaset-controller";
        assert!(
            forbidden_changes(
                &old,
                &pod("masters", &["berth.io/avoid"], Some("ReplicaSet")),
                adopter,
                BERTH
            )
            .is_empty()
        );
    }

    #[test]
    fn a_record_of_an_avoid_policy_comes_with_its_gate() {
        let masters: crate::policy::PlacementPolicy = serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "masters"},
            "spec": {"avoid": {"matchLabels": {"role": "master"}}}}))
        .unwrap();
        let cdn: crate::policy::PlacementPolicy = serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "cdn"}, "spec": {"pool": {"nodeNames": ["node2"]}}}))
        .unwrap();
        let (set, _) = PolicySet::compile([&masters, &cdn]);
        let tenant = Requester::from_username("tenant");
        let forged = unheld_record(&pod("cdn, masters", &["mine"], None), tenant, &set);
        assert!(forged.is_some_and(|m| m.contains("masters") && m.contains("berth.io/avoid")));
        assert_eq!(
            unheld_record(&pod("cdn,masters", &["berth.io/avoid"], None), tenant, &set),
            None
        );
        assert_eq!(unheld_record(&pod("cdn", &[], None), tenant, &set), None);
        assert_eq!(unheld_record(&pod("other", &[], None), tenant, &set), None);
        let controller = Requester::from_username(crate::names::DAEMONSET_CONTROLLER_USERS[0]);
        assert_eq!(
            unheld_record(&pod("masters", &[], Some("DaemonSet")), controller, &set),
            None,
            "DaemonSet pods are never held"
        );
        assert!(unheld_record(&pod("masters", &[], Some("DaemonSet")), tenant, &set).is_some());
    }
}
