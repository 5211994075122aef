//! What the webhook knows of the cluster: Namespaces, PlacementPolicies and Node
//! labels, read from the process's one model of the cluster ([`crate::cluster`]),
//! never from an API call per request. A namespace missing from the cache gets one
//! direct GET; if that fails too, the pod gets the safe answer (no grant).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::cluster::Cluster;
use crate::objects::NodeIndex;
use crate::placement::namespace::NamespaceInfo;
use crate::policy::PolicySet;

/// A boxed future, for the one async method of [`ClusterView`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The webhook's view of the cluster. [`Cluster`] is the real one; tests
/// use a fixed one.
pub trait ClusterView: Send + Sync {
    /// The compiled policies now.
    fn policies(&self) -> Arc<PolicySet>;
    /// Known nodes and their labels now.
    fn nodes(&self) -> Arc<NodeIndex>;
    /// The namespace, or `None` if it cannot be found.
    fn namespace<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<Arc<NamespaceInfo>>>;
    /// Whether every cache has finished its first list.
    fn synced(&self) -> bool;
    /// What group decisions need: the gang mode and the PriorityClasses.
    fn groups(&self) -> Arc<GroupState>;
}

pub use crate::cluster::GroupState;

/// A view that never changes, for tests and offline use.
#[derive(Debug, Default)]
pub struct FixedView {
    pub policies: Arc<PolicySet>,
    pub nodes: Arc<NodeIndex>,
    pub namespaces: BTreeMap<String, Arc<NamespaceInfo>>,
    pub groups: Arc<GroupState>,
}

impl ClusterView for FixedView {
    fn policies(&self) -> Arc<PolicySet> {
        self.policies.clone()
    }
    fn nodes(&self) -> Arc<NodeIndex> {
        self.nodes.clone()
    }
    fn namespace<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<Arc<NamespaceInfo>>> {
        Box::pin(async move { self.namespaces.get(name).cloned() })
    }
    fn synced(&self) -> bool {
        true
    }
    fn groups(&self) -> Arc<GroupState> {
        self.groups.clone()
    }
}

impl ClusterView for Cluster {
    fn policies(&self) -> Arc<PolicySet> {
        self.in_force().set.clone()
    }

    fn nodes(&self) -> Arc<NodeIndex> {
        self.node_labels()
    }

    fn namespace<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<Arc<NamespaceInfo>>> {
        Box::pin(Cluster::namespace(self, name))
    }

    fn synced(&self) -> bool {
        self.webhook_synced()
    }

    fn groups(&self) -> Arc<GroupState> {
        Cluster::groups(self)
    }
}
