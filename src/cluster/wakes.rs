//! Which loops a change wakes, and what it touched.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// What changed since a loop last looked: some nodes (the node itself, or a pod
/// bound to it), or everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    Everything,
    Nodes(HashSet<String>),
}

impl Changed {
    /// No node changed: what a second notice finds when the pass it asked for
    /// already took its change (the notice came while that pass slept). Whether
    /// only the policies' status changed is [`Wakes::take_status`].
    pub fn is_nothing(&self) -> bool {
        matches!(self, Changed::Nodes(nodes) if nodes.is_empty())
    }
}

/// Changes gathered for one reader until it takes them; at first, everything.
struct Changes(Mutex<Changed>);

impl Default for Changes {
    fn default() -> Self {
        Changes(Mutex::new(Changed::Everything))
    }
}

impl Changes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Changed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn node(&self, name: &str) {
        if let Changed::Nodes(nodes) = &mut *self.lock() {
            nodes.insert(name.to_owned());
        }
    }

    fn everything(&self) {
        *self.lock() = Changed::Everything;
    }

    fn take(&self) -> Changed {
        std::mem::replace(&mut *self.lock(), Changed::Nodes(HashSet::new()))
    }
}

/// Which loops a change wakes, and which nodes it touched: the releases (held
/// pods) and the nodes (labels, taints, status). Both work only on what changed,
/// so a pod event costs one node, not the cluster: the nodes loop recomputes the
/// nodes it touched (or all of them, after a policy, namespace or DaemonSet
/// change, a relist, a resync or a new leader), the releases loop the room left
/// on them (or all of it, after a relist of nodes or pods).
#[derive(Default)]
pub struct Wakes {
    pub releases: Notify,
    pub nodes: Notify,
    /// The StaticPlacement writer, which compiles the policies and the namespaces'
    /// image overrides ([`crate::controller::static_placement`]).
    pub placement: Notify,
    for_nodes: Changes,
    for_rooms: Changes,
    /// Something only the policies' status reports changed.
    status: AtomicBool,
    /// See [`Wakes::publishing`].
    publishing: Mutex<()>,
}

impl Wakes {
    /// Held while the model publishes what every node depends on (the policies in
    /// force, the namespaces, the DaemonSets) and wakes the loops for it, and while
    /// the nodes loop takes what changed and reads that state: so a pass that reads
    /// a change has also taken its wake, and no second pass follows for a change
    /// already seen. Never held across an await.
    pub fn publishing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.publishing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node `name` changed, or a pod bound to it did: wakes the nodes loop.
    pub fn node(&self, name: &str) {
        self.for_nodes.node(name);
        self.for_rooms.node(name);
        self.nodes.notify_one();
    }

    /// A pod bound to `name` changed, but nothing of it the node's labels and
    /// taints depend on: only the room on the node (what it runs, and how much).
    pub fn room(&self, name: &str) {
        self.for_rooms.node(name);
    }

    /// Something every node's desired state depends on changed: wakes the nodes
    /// loop. The room on nodes depends only on the nodes and their pods.
    pub fn everything(&self) {
        self.for_nodes.everything();
        self.nodes.notify_one();
    }

    /// Something every node and every held pod depend on changed (a policy, a
    /// namespace): wakes both loops, and the StaticPlacement writer.
    pub fn all(&self) {
        self.everything();
        self.releases.notify_one();
        self.placement.notify_one();
    }

    /// Something only the policies' status reports changed (a gang timed out):
    /// wakes the nodes loop for a pass that writes it, over no node.
    pub fn status(&self) {
        self.status.store(true, Ordering::SeqCst);
        self.nodes.notify_one();
    }

    /// A watch on nodes or pods listed again: anything may have changed.
    pub(super) fn relisted(&self) {
        self.for_rooms.everything();
        self.everything();
    }

    /// What changed for the nodes loop since it last took it.
    pub fn take(&self) -> Changed {
        self.for_nodes.take()
    }

    /// Whether the policies' status changed since the nodes loop last took it.
    pub fn take_status(&self) -> bool {
        self.status.swap(false, Ordering::SeqCst)
    }

    /// What changed for the room on nodes since the releases loop last took it.
    pub fn take_for_rooms(&self) -> Changed {
        self.for_rooms.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_gather_the_nodes_that_changed_until_everything_did() {
        let wakes = Wakes::default();
        assert_eq!(wakes.take(), Changed::Everything, "the first pass sees all");
        wakes.node("n1");
        wakes.node("n2");
        wakes.node("n1");
        assert_eq!(
            wakes.take(),
            Changed::Nodes(HashSet::from(["n1".into(), "n2".into()]))
        );
        assert!(wakes.take().is_nothing(), "taken once");
        wakes.node("n1");
        wakes.everything();
        wakes.node("n3");
        assert_eq!(wakes.take(), Changed::Everything);
    }

    #[test]
    fn a_status_change_changes_no_node_and_is_taken_once() {
        let wakes = Wakes::default();
        wakes.take();
        wakes.status();
        assert!(wakes.take().is_nothing(), "no node to look at");
        assert!(wakes.take_status());
        assert!(!wakes.take_status(), "taken once");
    }

    #[test]
    fn rooms_change_with_nodes_and_relists_not_with_policies() {
        let wakes = Wakes::default();
        assert_eq!(wakes.take_for_rooms(), Changed::Everything, "at first");
        wakes.everything();
        wakes.node("n1");
        assert_eq!(
            wakes.take_for_rooms(),
            Changed::Nodes(HashSet::from(["n1".into()]))
        );
        assert_eq!(wakes.take(), Changed::Everything, "each reader its own");
        wakes.relisted();
        assert_eq!(wakes.take_for_rooms(), Changed::Everything);
        assert_eq!(wakes.take(), Changed::Everything);
    }
}
