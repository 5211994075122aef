//! The berth annotations on a Namespace (SPEC "Names"):
//!
//! - `berth.io/policies: "cdn, gpu"` opts the namespace into policies;
//! - `berth.io/images.<policy>: "*cdn*, registry.example.com/cdn/*"` replaces that
//!   policy's image globs for this namespace;
//! - `berth.io/scheduler-name: <name>` routes every pod of the namespace.
//!
//! Any other `berth.io/` key on a namespace is a mistake (a typo would silently
//! do nothing), so it is an error too.

use std::collections::BTreeMap;

use super::image::ImagePatterns;
use crate::names::{
    IMAGES_ANNOTATION_PREFIX, MAX_POLICY_NAME, POLICIES_ANNOTATION, SCHEDULER_ANNOTATION,
    is_dns_subdomain, is_valid_policy_name,
};

/// What a namespace's berth annotations say.
#[derive(Debug, Clone, Default)]
pub struct NamespaceConfig {
    /// Policies named in `berth.io/policies`, in the order written, without repeats.
    pub policies: Vec<String>,
    /// Per-policy image globs that replace the policy's own `images`.
    pub images: BTreeMap<String, ImagePatterns>,
    /// `berth.io/scheduler-name`.
    pub scheduler_name: Option<String>,
}

/// A berth annotation that cannot be read; says which and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}: {problem}")]
pub struct AnnotationError {
    pub key: String,
    pub problem: String,
}

impl AnnotationError {
    fn new(key: &str, problem: impl Into<String>) -> Self {
        AnnotationError {
            key: key.to_owned(),
            problem: problem.into(),
        }
    }
}

impl NamespaceConfig {
    /// Reads the berth annotations out of a namespace's annotations; other keys
    /// are ignored.
    pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Self, AnnotationError> {
        let mut config = NamespaceConfig::default();
        for (key, value) in annotations {
            if key == POLICIES_ANNOTATION {
                config.policies = parse_policy_list(key, value)?;
            } else if let Some(policy) = key.strip_prefix(IMAGES_ANNOTATION_PREFIX) {
                if !is_valid_policy_name(policy) {
                    return Err(AnnotationError::new(key, bad_name(policy)));
                }
                let compiled = image_override(value).map_err(|e| AnnotationError::new(key, e))?;
                config.images.insert(policy.to_owned(), compiled);
            } else if key == SCHEDULER_ANNOTATION {
                let name = value.trim();
                if !is_dns_subdomain(name) {
                    return Err(AnnotationError::new(
                        key,
                        format!("{name:?} is not a valid scheduler name (a DNS-1123 subdomain)"),
                    ));
                }
                config.scheduler_name = Some(name.to_owned());
            } else if key.starts_with("berth.io/") {
                return Err(AnnotationError::new(
                    key,
                    format!(
                        "unknown berth annotation; namespaces take {POLICIES_ANNOTATION}, \
                         {IMAGES_ANNOTATION_PREFIX}<policy> and {SCHEDULER_ANNOTATION}"
                    ),
                ));
            }
        }
        Ok(config)
    }

    /// Whether the namespace carries any berth annotation at all.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty() && self.images.is_empty() && self.scheduler_name.is_none()
    }
}

/// The globs of a `berth.io/images.<policy>` value, separated by commas.
pub fn image_override(value: &str) -> Result<ImagePatterns, String> {
    let patterns: Vec<&str> = value.split(',').map(str::trim).collect();
    if patterns.iter().all(|p| p.is_empty()) {
        return Err("lists no image pattern".into());
    }
    if let Some(i) = patterns.iter().position(|p| p.is_empty()) {
        return Err(empty_entry(i));
    }
    ImagePatterns::new(&patterns).map_err(|e| e.to_string())
}

fn parse_policy_list(key: &str, value: &str) -> Result<Vec<String>, AnnotationError> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut policies: Vec<String> = Vec::new();
    for (i, entry) in value.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            return Err(AnnotationError::new(key, empty_entry(i)));
        }
        if !is_valid_policy_name(entry) {
            return Err(AnnotationError::new(key, bad_name(entry)));
        }
        if !policies.iter().any(|p| p == entry) {
            policies.push(entry.to_owned());
        }
    }
    Ok(policies)
}

fn empty_entry(index: usize) -> String {
    format!(
        "entry {} is empty (write names separated by commas)",
        index + 1
    )
}

fn bad_name(name: &str) -> String {
    format!(
        "{name:?} is not a valid policy name (lowercase letters, digits, '-' and '.', \
         at most {MAX_POLICY_NAME} characters)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ImageRef;

    fn parse(pairs: &[(&str, &str)]) -> Result<NamespaceConfig, AnnotationError> {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NamespaceConfig::parse(&map)
    }

    #[test]
    fn policies_are_a_comma_separated_list() {
        let config = parse(&[("berth.io/policies", " cdn, gpu ,cdn")]).unwrap();
        assert_eq!(config.policies, ["cdn", "gpu"]);
        assert!(
            parse(&[("berth.io/policies", "")])
                .unwrap()
                .policies
                .is_empty()
        );
    }

    #[test]
    fn broken_policy_lists_say_what_is_wrong() {
        let err = parse(&[("berth.io/policies", "cdn,,gpu")]).unwrap_err();
        assert_eq!(err.key, "berth.io/policies");
        assert_eq!(
            err.problem,
            "entry 2 is empty (write names separated by commas)"
        );
        let err = parse(&[("berth.io/policies", "cdn; gpu")]).unwrap_err();
        assert!(
            err.problem
                .starts_with("\"cdn; gpu\" is not a valid policy name"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("annotation berth.io/policies: {}", err.problem)
        );
    }

    #[test]
    fn image_overrides_compile_per_policy() {
        let config =
            parse(&[("berth.io/images.cdn", "*cdn*, registry.example.com/cdn/*")]).unwrap();
        let patterns = &config.images["cdn"];
        assert_eq!(patterns.patterns(), ["*cdn*", "registry.example.com/cdn/*"]);
        assert!(
            patterns
                .first_match(&ImageRef::new("registry.example.com/cdn/x"))
                .is_some()
        );
    }

    #[test]
    fn broken_image_overrides_are_errors() {
        let err = parse(&[("berth.io/images.cdn", "[oops")]).unwrap_err();
        assert!(err.problem.contains("bad image glob \"[oops\""), "{err}");
        let err = parse(&[("berth.io/images.cdn", " , ")]).unwrap_err();
        assert_eq!(err.problem, "lists no image pattern");
        let err = parse(&[("berth.io/images.CDN", "*cdn*")]).unwrap_err();
        assert!(err.problem.contains("not a valid policy name"), "{err}");
    }

    #[test]
    fn scheduler_name_must_be_a_dns_subdomain() {
        let config = parse(&[("berth.io/scheduler-name", "my-scheduler")]).unwrap();
        assert_eq!(config.scheduler_name.as_deref(), Some("my-scheduler"));
        let err = parse(&[("berth.io/scheduler-name", "My Scheduler")]).unwrap_err();
        assert!(err.problem.contains("not a valid scheduler name"), "{err}");
    }

    #[test]
    fn unknown_berth_annotations_are_errors_and_others_are_ignored() {
        let err = parse(&[("berth.io/policy", "cdn")]).unwrap_err();
        assert!(err.problem.starts_with("unknown berth annotation"), "{err}");
        let config = parse(&[("example.com/team", "cdn")]).unwrap();
        assert!(config.is_empty());
    }
}
