//! Events the controller publishes, each once while its cause lasts.
//!
//! Keys name the object by uid (a pod deleted and created again under the same name
//! is another pod), and the memory holds only the causes seen in the last pass: a
//! cause that goes away is forgotten, so the set is as large as the problems the
//! cluster has now, never larger, and a problem that comes back is reported again.
//!
//! Events are sent by a task of their own ([`Events`]): a thousand pods that start
//! waiting at once are a thousand requests, and the loops must not wait for them.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;

use crate::objects::PodObject;

/// Events waiting to be sent, at most; past that a cause is tried again next pass.
const QUEUED_EVENTS: usize = 4096;

/// Where the loops hand their Events: a queue a task empties into the recorder.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(Event, ObjectReference)>,
}

impl Events {
    /// Starts the task that sends what is queued, one Event after the other. It ends
    /// when every handle is dropped.
    pub fn start(recorder: Recorder) -> Events {
        let (queue, mut queued) = mpsc::channel::<(Event, ObjectReference)>(QUEUED_EVENTS);
        tokio::spawn(async move {
            while let Some((event, reference)) = queued.recv().await {
                if let Err(e) = recorder.publish(&event, &reference).await {
                    tracing::warn!(error = %e, "cannot publish event");
                }
            }
        });
        Events { queue }
    }

    /// Queues an Event; false when the queue is full.
    pub fn send(&self, event: Event, reference: &ObjectReference) -> bool {
        self.queue.try_send((event, reference.clone())).is_ok()
    }
}

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
    /// lasted. With the queue full, the cause counts as not reported yet.
    pub fn publish(
        &mut self,
        events: &Events,
        key: String,
        event: Event,
        reference: &ObjectReference,
    ) {
        if self.first(key.clone()) && !events.send(event, reference) {
            tracing::debug!(%key, "event queue full; reported on a later pass");
            self.current.remove(&key);
        }
    }
}

/// The reference an Event about a pod names.
pub fn pod_reference(namespace: &str, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid: uid.map(str::to_owned),
        ..Default::default()
    }
}

/// The reference of an Event about a cached pod.
pub fn reference_of(pod: &PodObject) -> ObjectReference {
    let meta = &pod.metadata;
    pod_reference(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref(),
    )
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
    fn a_cause_whose_event_finds_the_queue_full_is_reported_on_a_later_pass() {
        let (queue, mut queued) = mpsc::channel(1);
        let events = Events { queue };
        let reference = ObjectReference::default();
        let note = || event(EventType::Normal, "Held", "Hold", "held".into());
        let mut reported = Reported::default();
        reported.publish(&events, "a".into(), note(), &reference);
        reported.publish(&events, "b".into(), note(), &reference);
        reported.end_pass();
        assert!(queued.try_recv().is_ok(), "a was queued");
        assert!(queued.try_recv().is_err(), "b found the queue full");
        reported.publish(&events, "a".into(), note(), &reference);
        reported.publish(&events, "b".into(), note(), &reference);
        assert!(queued.try_recv().is_ok(), "b is tried again, a is not");
        assert!(queued.try_recv().is_err());
    }

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
