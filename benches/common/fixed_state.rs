//! berth's webhook state without a cluster: the policy of `policies/cdn.yaml` (a
//! dedicated pool on node2), one namespace opted into it, and a node cache. The
//! decision bench admits through it in-process; the `/mutate` row of the cluster
//! bench serves berth's own router with it over TLS, to tell the cost of berth's
//! decision apart from the cost of its live process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use berth::admission::body::BodyLimits;
use berth::admission::handlers::AppState;
use berth::admission::state::FixedView;
use berth::objects::{NodeIndex, NodeInfo};
use berth::placement::feasibility::with_pool_state;
use berth::placement::namespace::NamespaceInfo;
use berth::policy::{PlacementPolicy, PolicySet};

/// A node cache of `count` nodes with the labels kwok's nodes carry, one of them
/// `pool_node`. The others' names sort before it, so a scan of the cache in order
/// meets the pool's node last.
pub fn node_cache(count: usize, pool_node: &str) -> NodeIndex {
    (0..count)
        .map(|i| {
            let name = if i == 0 {
                pool_node.to_string()
            } else {
                format!("n-{i:05}")
            };
            let zone = if i % 2 == 0 { "a" } else { "b" };
            let labels = [
                ("kubernetes.io/hostname", name.as_str()),
                ("kubernetes.io/os", "linux"),
                ("topology.kubernetes.io/zone", zone),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let info = NodeInfo {
                labels,
                taints: Vec::new(),
            };
            (name, info)
        })
        .collect()
}

/// The node of `policies/cdn.yaml`'s pool.
const POOL_NODE: &str = "node2";

/// The webhook's state with the cdn policy, `namespace` opted into it, and
/// `nodes` nodes in the cache, node2 among them (with the pool's label and taint,
/// as berth's controller keeps it).
pub fn review_state(nodes: usize, namespace: &str) -> Arc<AppState> {
    let cdn: PlacementPolicy = serde_yaml_ng::from_str(include_str!("../../policies/cdn.yaml"))
        .expect("policies/cdn.yaml");
    let (policies, errors) = PolicySet::compile([&cdn]);
    assert!(errors.is_empty());
    let mut info = NamespaceInfo::new(namespace);
    info.annotations
        .insert("berth.io/policies".into(), "cdn".into());
    let mut cache = node_cache(nodes, POOL_NODE);
    // The pool's node as berth's controller keeps it: with its label and taint.
    if let Some(pool_node) = cache.get(POOL_NODE).cloned() {
        let kept = with_pool_state(POOL_NODE, &pool_node, &policies);
        cache.insert(POOL_NODE.into(), Arc::new(kept));
    }
    let view = FixedView {
        policies: Arc::new(policies),
        nodes: Arc::new(cache),
        namespaces: BTreeMap::from([(namespace.to_string(), Arc::new(info))]),
        groups: Arc::default(),
    };
    Arc::new(AppState {
        view: Arc::new(view),
        metrics: Arc::default(),
        tls_ready: true.into(),
        limits: BodyLimits::new(19 << 20, 128 << 20, Duration::from_secs(10)),
        berth_user: "system:serviceaccount:berth-system:berth".into(),
        trust: Default::default(),
        review_timeout: Duration::from_secs(3),
    })
}
