//! berth's static placement for the apiserver: the `StaticPlacement` object that
//! the MutatingAdmissionPolicy `berth-placement` and the ValidatingAdmissionPolicy
//! `berth-placed` take as their params (SPEC "Placement that holds with berth
//! down").
//!
//! The admission policies are static CEL, shipped once; what changes with the
//! policies is this one cluster-scoped object, named `berth`, which only berth's
//! controller writes. It holds every policy in force, compiled to what CEL reads
//! cheaply: image globs as one RE2 regex, grants as the requirements,
//! preferences and toleration berth gives, and each namespace override of images
//! (`berth.io/images.<policy>`) by its annotation's value. One object, not one
//! per policy, because the apiserver runs a policy once per param, each run on the
//! output of the one before: two Required pools must become one `In`, and the
//! first scheduler by name must win, which needs every policy at once.
//!
//! What needs the cluster's state (anchors, group counts, objects to create) is
//! not compiled: such a policy is `webhookOnly`, with the reason, and a pod it
//! applies to is left to the webhook.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::grants::grants_for;
use crate::names::POOL_LABEL;
use crate::policy::annotations::image_override;
use crate::policy::image_cel::glob_regex;
use crate::policy::{CompiledPolicy, PolicySet};

/// The name of the one `StaticPlacement` object.
pub const STATIC_PLACEMENT_NAME: &str = "berth";

/// berth's policies as the apiserver applies them with berth down; written by
/// berth's controller only.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "berth.io",
    version = "v1alpha1",
    kind = "StaticPlacement",
    plural = "staticplacements"
)]
#[serde(rename_all = "camelCase")]
pub struct StaticPlacementSpec {
    /// Every policy in force, sorted by name.
    #[serde(default)]
    pub policies: Vec<StaticPolicy>,
    /// Each value of a `berth.io/images.<policy>` annotation on a namespace, and
    /// its globs as one RE2 regex. A value missing here (a namespace annotated
    /// since the controller last wrote) or mapped to `""` (globs CEL cannot
    /// express) leaves the namespace's pods to the webhook.
    #[serde(default)]
    pub image_overrides: BTreeMap<String, String>,
}

/// One policy, compiled for CEL.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticPolicy {
    pub name: String,
    /// Why the apiserver cannot apply this policy; absent when it can. A pod a
    /// webhook-only policy applies to is left whole to the webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_only: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// `images` as one RE2 regex over normalised references; absent: every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coscheduled: Option<LabelSelector>,
    /// A Required pool: its name joins the one `berth.pool In` requirement.
    #[serde(default, skip_serializing_if = "is_false")]
    pub required_pool: bool,
    /// A dedicated pool's taint effect, for the exclusion of wildcard tolerations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_effect: Option<String>,
    /// Required expressions besides the pool's, as berth writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<NodeSelectorRequirement>,
    /// Preferred terms, each of one requirement, as berth writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<StaticPreference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration: Option<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// `avoid`: a pod this selects is held by the webhook, so is left to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avoids: Option<LabelSelector>,
}

/// A preferred term of one requirement, with its weight.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticPreference {
    pub weight: i32,
    #[serde(flatten)]
    pub requirement: NodeSelectorRequirement,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl StaticPolicy {
    /// `policy` compiled for CEL; `webhook_only` says why when it cannot be.
    pub fn compile(policy: &CompiledPolicy) -> StaticPolicy {
        let spec = &policy.spec;
        let images = (!policy.images.is_empty()).then(|| glob_regex(&policy.images));
        let mut webhook_only = webhook_only(policy);
        let images = match images {
            Some(Err(reason)) => {
                // Which pods it applies to is unknown: every pod, so that the
                // webhook decides them all.
                webhook_only.get_or_insert(format!("images: {reason}"));
                None
            }
            Some(Ok(regex)) => Some(regex),
            None => None,
        };
        let grants = grants_for(&[policy]);
        let (pool, required): (Vec<_>, Vec<_>) = grants
            .required
            .into_iter()
            .partition(|r| r.key == POOL_LABEL && r.operator == "In");
        StaticPolicy {
            name: policy.name.clone(),
            webhook_only,
            namespace_selector: spec.namespace_selector.clone(),
            images,
            pod_selector: spec.pod_selector.clone(),
            coscheduled: spec.coscheduled.clone(),
            required_pool: !pool.is_empty(),
            dedicated_effect: policy
                .dedicated_pool()
                .map(|p| p.effect.as_str().to_owned()),
            required,
            preferred: grants
                .preferred
                .into_iter()
                .filter_map(|term| {
                    let mut expressions = term.preference.match_expressions?;
                    // berth's own preferences are of one requirement each.
                    (expressions.len() == 1).then(|| StaticPreference {
                        weight: term.weight,
                        requirement: expressions.remove(0),
                    })
                })
                .collect(),
            toleration: grants.tolerations.into_iter().next(),
            scheduler_name: spec.scheduler_name.clone(),
            avoids: spec.avoid.clone(),
        }
    }
}

/// Why the apiserver cannot apply `policy` alone, if it cannot: what it grants
/// needs the cluster's state or objects berth creates.
fn webhook_only(policy: &CompiledPolicy) -> Option<String> {
    let spec = &policy.spec;
    let needs = [
        (spec.colocate_with.is_some(), "colocateWith"),
        (spec.avoid.is_some(), "avoid"),
        (spec.gang.is_some(), "gang"),
        (spec.start_order.is_some(), "startOrder"),
        (spec.queue.is_some(), "queue"),
    ];
    let fields: Vec<&str> = needs
        .iter()
        .filter(|(set, _)| *set)
        .map(|(_, f)| *f)
        .collect();
    (!fields.is_empty()).then(|| {
        format!(
            "{} needs the cluster's state, which only the webhook sees",
            fields.join(", ")
        )
    })
}

impl StaticPlacementSpec {
    /// The param for `policies`, with the `berth.io/images.<policy>` values
    /// `overrides` that namespaces carry.
    pub fn compile<'a>(
        policies: &PolicySet,
        overrides: impl IntoIterator<Item = &'a str>,
    ) -> StaticPlacementSpec {
        let mut policies: Vec<StaticPolicy> = policies.iter().map(StaticPolicy::compile).collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        let values: BTreeSet<&str> = overrides.into_iter().collect();
        let image_overrides = values
            .into_iter()
            .map(|value| (value.to_owned(), override_regex(value).unwrap_or_default()))
            .collect();
        StaticPlacementSpec {
            policies,
            image_overrides,
        }
    }

    /// The policy named `name`, if in force.
    pub fn policy(&self, name: &str) -> Option<&StaticPolicy> {
        self.policies.iter().find(|p| p.name == name)
    }
}

/// A `berth.io/images.<policy>` value's globs as one RE2 regex, read as the
/// namespace's annotations are; `None` when they do not compile or CEL cannot
/// express them.
fn override_regex(value: &str) -> Option<String> {
    glob_regex(&image_override(value).ok()?).ok()
}

/// The `StaticPlacement` CustomResourceDefinition as YAML.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&StaticPlacement::crd()).expect("a CRD always serialises to YAML")
}
