//! Scheduler routing (SPEC scenario 5): `berth.io/scheduler-name` on the namespace,
//! else the `schedulerName` of an applied policy. A pod that already names a
//! scheduler other than the default keeps it: that is the user's own choice.

use super::warning::bounded;
use crate::policy::{CompiledPolicy, NamespaceConfig};

const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The scheduler berth sets, if any, and warnings about conflicts.
pub fn scheduler_name(
    current: Option<&str>,
    config: Option<&NamespaceConfig>,
    applied: &[&CompiledPolicy],
) -> (Option<String>, Vec<String>) {
    let mut warnings = Vec::new();
    let from_policies: Vec<(&str, &str)> = applied
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.spec.scheduler_name.as_deref()?)))
        .collect();
    let wanted = match config.and_then(|c| c.scheduler_name.as_deref()) {
        Some(name) => Some(name),
        None => {
            if let Some((first, name)) = from_policies.first()
                && let Some((other, other_name)) = from_policies.iter().find(|(_, n)| n != name)
            {
                warnings.push(bounded(format!(
                    "policies {first} and {other} name different schedulers; using {name}, not {other_name}"
                )));
            }
            from_policies.first().map(|(_, name)| *name)
        }
    };
    let Some(wanted) = wanted else {
        return (None, warnings);
    };
    match current {
        Some(own) if own != DEFAULT_SCHEDULER && own != wanted => {
            warnings.push(bounded(format!(
                "the pod names scheduler {own}; berth leaves it (its policies say {wanted})"
            )));
            (None, warnings)
        }
        _ => (Some(wanted.to_owned()), warnings),
    }
}
