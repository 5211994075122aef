//! Which policies apply to a pod, and why (SPEC "PlacementPolicy", first comment):
//! the namespace opts in (annotation or `namespaceSelector`), AND an image matches
//! (`images`, or the namespace's `berth.io/images.<policy>` override; empty means
//! every pod), AND the pod matches `podSelector`; or, in a namespace that opts in,
//! the pod matches `coscheduled` (it goes with its group, whatever its images).

use super::namespace::NamespaceInfo;
use super::warning::bounded;
use crate::names::{IMAGES_ANNOTATION_PREFIX, POLICIES_ANNOTATION};
use crate::objects::PodObject;
use crate::policy::{CompiledPolicy, ImagePatterns, NamespaceConfig, PolicySet};

/// A policy that applies to the pod, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub policy: String,
    pub why: Vec<String>,
    /// Whether it applies through `coscheduled` (the pod goes with its group).
    pub with_group: bool,
}

/// A policy the namespace opts into that does not apply to this pod, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedOver {
    pub policy: String,
    pub why: String,
}

/// The outcome of matching every policy against one pod.
#[derive(Debug, Default)]
pub struct Matches<'p> {
    pub applied: Vec<(&'p CompiledPolicy, Applied)>,
    pub passed_over: Vec<PassedOver>,
    pub warnings: Vec<String>,
}

/// Matches `pod` against every policy. With no readable namespace config
/// (`config` is `None`), the namespace opts into nothing.
pub fn match_policies<'p>(
    pod: &PodObject,
    namespace: &NamespaceInfo,
    config: Option<&NamespaceConfig>,
    policies: &'p PolicySet,
) -> Matches<'p> {
    let mut matches = Matches::default();
    if let Some(config) = config {
        for name in &config.policies {
            if policies.get(name).is_none() {
                matches.warnings.push(bounded(format!(
                    "namespace {} opts into unknown policy {name:?} ({POLICIES_ANNOTATION})",
                    namespace.name
                )));
            }
        }
        for name in config.images.keys() {
            if policies.get(name).is_none() {
                matches.warnings.push(bounded(format!(
                    "namespace {} sets {IMAGES_ANNOTATION_PREFIX}{name} for unknown policy",
                    namespace.name
                )));
            }
        }
    }
    let images = pod.images();
    let labels = pod.labels();
    for policy in policies.iter() {
        let Some(opted_in) = opt_in(policy, namespace, config) else {
            continue;
        };
        let pass_over = |why: String| PassedOver {
            policy: policy.name.clone(),
            why,
        };
        if policy.routes_with_group(labels) {
            let why = "the pod's labels match coscheduled: it goes with its group, whatever \
                       its images";
            matches.applied.push((
                policy,
                Applied {
                    policy: policy.name.clone(),
                    why: vec![opted_in, why.into()],
                    with_group: true,
                },
            ));
            continue;
        }
        let (patterns, source) = match config.and_then(|c| c.images.get(&policy.name)) {
            Some(patterns) => (
                patterns,
                format!("{IMAGES_ANNOTATION_PREFIX}{}", policy.name),
            ),
            None => (&policy.images, "the policy's images".to_owned()),
        };
        let image_reason = match image_match(patterns, &images) {
            Ok(reason) => reason,
            Err(()) => {
                matches.passed_over.push(pass_over(format!(
                    "no image matches {} ({source})",
                    patterns.patterns().join(", ")
                )));
                continue;
            }
        };
        if !policy.selects_pod(labels) {
            matches.passed_over.push(pass_over(
                "the pod's labels do not match podSelector".into(),
            ));
            continue;
        }
        let mut why = vec![opted_in, image_reason];
        if policy.spec.pod_selector.is_some() {
            why.push("the pod's labels match podSelector".into());
        }
        matches.applied.push((
            policy,
            Applied {
                policy: policy.name.clone(),
                why,
                with_group: false,
            },
        ));
    }
    matches
}

/// Whether the namespace opts into `policy`. With no readable namespace config
/// (`config` is `None`), it opts into nothing.
pub fn opts_in(
    policy: &CompiledPolicy,
    namespace: &NamespaceInfo,
    config: Option<&NamespaceConfig>,
) -> bool {
    config.is_some_and(|c| policy.namespace_opts_in(c, &namespace.labels))
}

/// Why the namespace opts into `policy`, or `None` if it does not.
fn opt_in(
    policy: &CompiledPolicy,
    namespace: &NamespaceInfo,
    config: Option<&NamespaceConfig>,
) -> Option<String> {
    if !opts_in(policy, namespace, config) {
        return None;
    }
    let config = config?;
    Some(if config.policies.contains(&policy.name) {
        format!(
            "namespace {} opts in with {POLICIES_ANNOTATION}",
            namespace.name
        )
    } else {
        format!(
            "namespace {} matches the policy's namespaceSelector",
            namespace.name
        )
    })
}

/// Why the pod's images satisfy `patterns`, or `Err` if none matches.
fn image_match(
    patterns: &ImagePatterns,
    images: &[super::pod::ContainerImage],
) -> Result<String, ()> {
    if patterns.is_empty() {
        return Ok("the policy lists no images, so it covers every pod".into());
    }
    images
        .iter()
        .find_map(|c| {
            let glob = patterns.first_match(&c.image)?;
            let kind = if c.init {
                "init container"
            } else {
                "container"
            };
            Some(format!(
                "image {} of {kind} {} matches {glob}",
                c.image, c.container
            ))
        })
        .ok_or(())
}
