//! The pod the benches admit: as a Deployment creates it, about 6 KB of JSON.

use serde_json::{Value, json};

/// A pod as a Deployment creates it: three containers with env, probes, mounts
/// and resources, the default tolerations, and a preferred pod anti-affinity.
pub fn typical_pod() -> Value {
    let container = |name: &str, image: &str| {
        let env: Vec<Value> = (0..12)
            .map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-{i}-for-{name}")}))
            .collect();
        json!({
            "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
            "args": ["--config=/etc/app/config.yaml", "--log-level=info", "--listen=:8080"],
            "env": env,
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app"},
                             {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
            "securityContext": {"runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"
        })
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "uploader-7d9f8c6b5-", "namespace": "default",
            "labels": {"app": "uploader", "pod-template-hash": "7d9f8c6b5", "team": "edge", "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-01T10:00:00Z", "prometheus.io/scrape": "true"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "uploader-7d9f8c6b5",
                                 "uid": "3f1c0b7e-1111-2222-3333-444455556666", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "containers": [container("upload", "registry.example.com/cdn/uploader:2.4.1"),
                           container("metrics", "prom/statsd-exporter:v0.26.0"),
                           container("proxy", "envoyproxy/envoy:v1.30.1")],
            "volumes": [{"name": "config", "configMap": {"name": "uploader-config", "defaultMode": 420}},
                        {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                 "labelSelector": {"matchLabels": {"app": "uploader"}}}}]}},
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "schedulerName": "default-scheduler", "priority": 0,
            "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        }
    })
}

/// The AdmissionReview the apiserver sends for the typical pod's CREATE in
/// `namespace`, as the ReplicaSet controller makes it.
pub fn typical_review(namespace: &str) -> Value {
    let mut pod = typical_pod();
    pod["metadata"]["namespace"] = json!(namespace);
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod, "oldObject": null, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}})
}
