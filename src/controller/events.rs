//! Events the controller publishes, each once while its cause lasts.
//!
//! Keys name the object by uid (a pod deleted and created again under the same name
//! is another pod), and the memory holds only the causes seen in the last pass: a
//! cause that goes away is forgotten, so the set is as large as the problems the
//! cluster has now, never larger, and a problem that comes back is reported again.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// Published Events, keyed by cause.
#[derive(Debug, Default)]
pub struct Reported {
    /// Causes reported and still present at the end of the last pass.
    seen: BTreeSet<String>,
    /// Causes present in this pass.
    current: BTreeSet<String>,
}

impl Reported {
    /// Notes that `key`'s cause is present; true the first time in a row.
    pub fn first(&mut self, key: String) -> bool {
        let new = !self.seen.contains(&key) && !self.current.contains(&key);
        self.current.insert(key);
        new
    }

    /// Ends a pass: causes not noted in it are forgotten.
    pub fn end_pass(&mut self) {
        self.seen = std::mem::take(&mut self.current);
    }

    /// Whether no cause is remembered.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.seen.is_empty() && self.current.is_empty()
    }

    /// Publishes an Event for `key`'s cause unless it was published while the cause
    /// lasted.
    pub async fn publish(
        &mut self,
        recorder: &Recorder,
        key: String,
        event: Event,
        reference: &ObjectReference,
    ) {
        if !self.first(key) {
            return;
        }
        if let Err(e) = recorder.publish(&event, reference).await {
            tracing::warn!(error = %e, "cannot publish event");
        }
    }
}

/// An Event with the usual fields.
pub fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_reported_once_while_it_lasts_and_again_when_it_returns() {
        let mut reported = Reported::default();
        assert!(reported.first("held/uid-1".into()));
        assert!(!reported.first("held/uid-1".into()));
        reported.end_pass();
        assert!(!reported.first("held/uid-1".into()), "still there");
        reported.end_pass();
        reported.end_pass();
        assert!(reported.is_empty(), "gone causes are forgotten");
        assert!(
            reported.first("held/uid-1".into()),
            "and reported when back"
        );
    }
}
