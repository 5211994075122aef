#![cfg(feature = "e2e")]
//! The Helm chart in `charts/berth`: with default values it renders exactly the
//! objects of `manifests/` (and with cert-manager those of `certs/cert-manager/`),
//! its generated files are berth's own output, `helm lint` passes, other values
//! render what they promise, and installed with `helm install` into a test cluster
//! it runs seed 000's CDN scenario with berth running as the chart's ServiceAccount.
//!
//! helm is built from its Go module in `tests/cluster/helm/` (`build-helm`). It
//! never reads `~/.kube/config`: KUBECONFIG and `--kubeconfig` name the test
//! cluster's kubeconfig, or a file that does not exist where no cluster is needed.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use berth::names;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingWebhookConfiguration, ValidatingAdmissionPolicy,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};
use support::fixtures;
use support::helm::{CHART, helm_command, succeeded};
use support::{
    Nodes, TestCluster, cluster_script, eventually, fresh_namespace, has_applied, is_bound, opt_in,
    placed, repo_root, wait_for,
};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);
/// Labels Helm's conventions add to every templated object; manifests/ has none.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

fn helm(args: &[&str]) -> Output {
    helm_command(None).args(args).output().expect("run helm")
}

/// The objects of a YAML stream, empty documents left out.
fn parse(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// What `helm template --api-versions` says the cluster serves, as
/// `.Capabilities.APIVersions.Has` reads it: MutatingAdmissionPolicy v1
/// (Kubernetes 1.36 and later), which the placement policy is...
const MUTATING_ADMISSION_POLICY: &str = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy";
/// ...and the kind of its params, which `helm install` creates from crds/ before it
/// reads the cluster's APIs (and `helm upgrade` never does).
const STATIC_PLACEMENT: &str = "berth.io/v1alpha1/StaticPlacement";
/// A cluster where `placementPolicy.enabled=auto` installs the placement policy.
const SERVES_PLACEMENT: [&str; 2] = [MUTATING_ADMISSION_POLICY, STATIC_PLACEMENT];

/// `helm template` of the chart as release `berth` in `namespace`, CRDs included,
/// with `--set`-style `values`, for a cluster that serves MutatingAdmissionPolicy v1
/// and has the StaticPlacement CRD (a first `helm install` on Kubernetes 1.36+).
fn render(namespace: &str, values: &[&str]) -> Vec<Value> {
    render_for(namespace, &SERVES_PLACEMENT, values)
}

/// `render` for a cluster that serves `api_versions` on top of helm's defaults.
fn render_for(namespace: &str, api_versions: &[&str], values: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        "berth",
        CHART,
        "--namespace",
        namespace,
        "--include-crds",
    ];
    for api_version in api_versions {
        args.extend(["--api-versions", api_version]);
    }
    for value in values {
        args.extend(["--set", value]);
    }
    parse(&succeeded(&format!("helm {args:?}"), helm(&args)))
}

/// `kubectl kustomize` of a folder in the repository, by the control plane's kubectl.
fn kustomize(dir: &str) -> Vec<Value> {
    let bin = PathBuf::from(cluster_script("build", &[]).trim()).join("kubectl");
    let output = Command::new(bin)
        .arg("kustomize")
        .arg(repo_root().join(dir))
        .env(
            "KUBECONFIG",
            repo_root().join("target/test-helm/no-cluster"),
        )
        .output()
        .expect("run kubectl kustomize");
    parse(&succeeded(&format!("kubectl kustomize {dir}"), output))
}

/// "Kind namespace/name" of an object.
fn key(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or_default(),
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default()
    )
}

/// A whole number written as a float (the CRD's `maximum: 100.0`, which kustomize
/// writes as `100`) as the integer it is.
fn integers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && !n.is_i64()) {
                *value = json!(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integers),
        Value::Object(fields) => fields.values_mut().for_each(integers),
        _ => {}
    }
}

/// Objects by key, so that the chart and the manifests compare object by object;
/// with `from_helm`, Helm's labels taken out (and a label map they alone filled).
fn normalized(objects: Vec<Value>, from_helm: bool) -> BTreeMap<String, Value> {
    let mut by_key = BTreeMap::new();
    for mut object in objects {
        integers(&mut object);
        let metadata = object["metadata"].as_object_mut().expect("metadata");
        let labels = metadata.get_mut("labels").and_then(Value::as_object_mut);
        if let Some(labels) = labels.filter(|_| from_helm) {
            for label in HELM_LABELS {
                labels.remove(label);
            }
            if labels.is_empty() {
                metadata.remove("labels");
            }
        }
        let previous = by_key.insert(key(&object), object);
        assert!(previous.is_none(), "an object is rendered twice");
    }
    by_key
}

/// Where `chart` and `manifests` differ, one line per field: its path and both values.
fn differences(path: &str, chart: &Value, manifests: &Value, out: &mut String) {
    match (chart, manifests) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let (x, y) = (
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                );
                differences(&format!("{path}.{k}"), x, y, out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (a, b) if a != b => out.push_str(&format!(
            "  {path}\n    chart:     {a}\n    manifests: {b}\n"
        )),
        _ => {}
    }
}

/// Panics naming every object and field that differs.
fn assert_same_objects(chart: &BTreeMap<String, Value>, manifests: &BTreeMap<String, Value>) {
    let mut report = String::new();
    for (key, object) in manifests {
        match chart.get(key) {
            None => report.push_str(&format!("{key}: in the manifests, not in the chart\n")),
            Some(rendered) if rendered != object => {
                report.push_str(&format!("{key} differs:\n"));
                differences("", rendered, object, &mut report);
            }
            Some(_) => {}
        }
    }
    for key in chart.keys().filter(|k| !manifests.contains_key(*k)) {
        report.push_str(&format!("{key}: in the chart, not in the manifests\n"));
    }
    assert!(report.is_empty(), "chart and manifests differ:\n{report}");
}

/// The one object of `objects` with this key.
fn object<'a>(objects: &'a BTreeMap<String, Value>, key: &str) -> &'a Value {
    objects
        .get(key)
        .unwrap_or_else(|| panic!("{key} not rendered; got {:?}", objects.keys()))
}

/// The chart rendered like `render`, normalized.
fn chart(namespace: &str, values: &[&str]) -> BTreeMap<String, Value> {
    normalized(render(namespace, values), true)
}

/// The manifests in `dir` rendered by kustomize, normalized, without the Namespace
/// berth-system: Helm does not own its release namespace (`helm install
/// --create-namespace` makes it, and keeps the release record in it), so the chart
/// leaves it out.
fn manifests(dir: &str) -> BTreeMap<String, Value> {
    let mut objects = normalized(kustomize(dir), false);
    objects
        .remove("Namespace /berth-system")
        .expect("the manifests create berth-system");
    objects
}

#[test]
fn with_default_values_the_chart_renders_the_manifests() {
    assert_same_objects(&chart("berth-system", &[]), &manifests("manifests"));
}

#[test]
fn with_cert_manager_the_chart_renders_the_cert_manager_overlay() {
    assert_same_objects(
        &chart("berth-system", &["certificates.source=cert-manager"]),
        &manifests("certs/cert-manager"),
    );
}

#[test]
fn the_charts_generated_files_are_berths_output() {
    // The CRDs and the policy templates' sources are berth's output, as
    // manifests/crd.yaml, manifests/admission-policy.yaml and
    // manifests/placement-policy.yaml are (tests/cli.rs).
    for (command, file) in [
        ("crd", "charts/berth/crds/berth.io.yaml"),
        (
            "admission-policy",
            "charts/berth/files/admission-policy.yaml",
        ),
        (
            "admission-policy --placement",
            "charts/berth/files/placement-policy.yaml",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(command.split(' '))
            .output()
            .expect("run berth");
        let generated = succeeded(&format!("berth {command}"), output);
        let checked_in = std::fs::read_to_string(repo_root().join(file)).expect(file);
        assert!(
            generated == checked_in,
            "{file} is stale: run `berth {command} > {file}`"
        );
    }
}

#[test]
fn helm_is_the_release_its_module_pins() {
    // build-helm stamps HELM_VERSION from lib.sh; go.mod decides what is built.
    let go_mod = std::fs::read_to_string(repo_root().join("tests/cluster/helm/go.mod")).unwrap();
    let pinned = go_mod
        .lines()
        .find_map(|l| l.strip_prefix("require helm.sh/helm/v4 "))
        .expect("go.mod requires helm.sh/helm/v4");
    let version = succeeded(
        "helm version",
        helm(&["version", "--template", "{{.Version}}"]),
    );
    assert_eq!(version, pinned);
}

#[test]
fn helm_lint_passes() {
    for values in [
        "certificates.source=secret",
        "certificates.source=cert-manager",
    ] {
        let out = succeeded(
            "helm lint",
            helm(&["lint", "--strict", CHART, "--set", values]),
        );
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
}

/// The `values` of `kubernetes.io/metadata.name NotIn` in a namespaceSelector.
fn excluded(selector: &Value) -> Value {
    let expressions = selector["matchExpressions"]
        .as_array()
        .expect("expressions");
    assert_eq!(expressions.len(), 1, "{selector}");
    assert_eq!(expressions[0]["key"], "kubernetes.io/metadata.name");
    assert_eq!(expressions[0]["operator"], "NotIn");
    expressions[0]["values"].clone()
}

#[test]
fn excluded_namespaces_and_the_release_namespace_reach_every_selector() {
    let objects = chart(
        "ops",
        &["excludedNamespaces={kube-system,kube-node-lease,monitoring}"],
    );
    let all = json!(["kube-system", "kube-node-lease", "monitoring", "ops"]);
    let mutating = object(&objects, "MutatingWebhookConfiguration /berth");
    assert_eq!(excluded(&mutating["webhooks"][0]["namespaceSelector"]), all);
    // kube-system's DaemonSets (kube-proxy, CNI) still get pool tolerations.
    assert_eq!(
        excluded(&mutating["webhooks"][1]["namespaceSelector"]),
        json!(["kube-node-lease", "monitoring", "ops"])
    );
    let validating = object(&objects, "ValidatingWebhookConfiguration /berth");
    assert_eq!(
        excluded(&validating["webhooks"][0]["namespaceSelector"]),
        all
    );
    for policy in ["berth-pools", "berth-bindings", "berth-records"] {
        let vap = object(&objects, &format!("ValidatingAdmissionPolicy /{policy}"));
        assert_eq!(
            excluded(&vap["spec"]["matchConstraints"]["namespaceSelector"]),
            all,
            "{policy}"
        );
    }
    let placement = object(&objects, "MutatingAdmissionPolicy /berth-placement");
    assert_eq!(
        excluded(&placement["spec"]["matchConstraints"]["namespaceSelector"]),
        all
    );
    // berth is the release's ServiceAccount: only it may change berth's records.
    let records = object(&objects, "ValidatingAdmissionPolicy /berth-records");
    let conditions = records["spec"]["matchConditions"].as_array().unwrap();
    let not_berth = conditions
        .iter()
        .find(|c| c["name"] == "not-berth")
        .expect("not-berth condition");
    assert_eq!(
        not_berth["expression"],
        "request.userInfo.username != 'system:serviceaccount:ops:berth'"
    );
    // Everything namespaced is in the release namespace, and refers to it.
    for (key, object) in &objects {
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            assert_eq!(ns, "ops", "{key}");
        }
    }
    for binding in [
        "ClusterRoleBinding /berth-webhook",
        "RoleBinding ops/berth-leader-election",
    ] {
        assert_eq!(object(&objects, binding)["subjects"][0]["namespace"], "ops");
    }
    assert_eq!(
        mutating["webhooks"][0]["clientConfig"]["service"]["namespace"],
        "ops"
    );
}

#[test]
fn admission_policies_can_be_left_out_and_nothing_else_changes() {
    let all = chart("berth-system", &[]);
    let without = chart("berth-system", &["admissionPolicy.enabled=false"]);
    let mut others = all.clone();
    others.retain(|_, o| {
        !o["kind"]
            .as_str()
            .unwrap_or_default()
            .starts_with("ValidatingAdmissionPolicy")
    });
    // The policies and their bindings go; everything else stays as it was.
    let shipped = berth::admission::cel::manifests(berth::names::BERTH_SERVICE_ACCOUNT)
        .matches("kind: ValidatingAdmissionPolicy")
        .count();
    assert_eq!(all.len() - others.len(), shipped);
    assert_same_objects(&without, &others);
}

/// Whether `objects` hold the placement policy: the MutatingAdmissionPolicy
/// berth-placement and its binding, both or neither.
fn has_placement_policy(objects: &BTreeMap<String, Value>) -> bool {
    let policy = objects.contains_key("MutatingAdmissionPolicy /berth-placement");
    let binding = objects.contains_key("MutatingAdmissionPolicyBinding /berth-placement");
    assert_eq!(
        policy, binding,
        "the policy without its binding, or the reverse"
    );
    policy
}

#[test]
fn the_placement_policy_is_rendered_where_the_cluster_serves_it_unless_turned_off() {
    let served = chart("berth-system", &[]);
    assert!(has_placement_policy(&served));
    let mut others = served.clone();
    others.retain(|_, o| {
        !o["kind"]
            .as_str()
            .unwrap_or_default()
            .starts_with("MutatingAdmissionPolicy")
    });
    assert_eq!(served.len() - others.len(), 2);
    // `auto`, the default, leaves the policy out, and changes nothing else, on a
    // cluster without MutatingAdmissionPolicy v1 (before 1.36), and on one without
    // the StaticPlacement CRD (an upgrade whose CRDs were not applied first), where
    // the apiserver would refuse every pod the policy matches.
    for api_versions in [&[][..], &[STATIC_PLACEMENT], &[MUTATING_ADMISSION_POLICY]] {
        // A release upgraded with `--reuse-values` has the old chart's values,
        // without placementPolicy: it is `auto` too.
        for values in [
            &[][..],
            &["placementPolicy.enabled=auto"],
            &["placementPolicy=null"],
        ] {
            let auto = normalized(render_for("berth-system", api_versions, values), true);
            assert_same_objects(&auto, &others);
        }
    }
    for api_versions in [&[][..], &SERVES_PLACEMENT] {
        // `false` never renders it; `true` always does, as `auto` does where the
        // cluster can run it.
        let off = normalized(
            render_for(
                "berth-system",
                api_versions,
                &["placementPolicy.enabled=false"],
            ),
            true,
        );
        assert_same_objects(&off, &others);
        let on = normalized(
            render_for(
                "berth-system",
                api_versions,
                &["placementPolicy.enabled=true"],
            ),
            true,
        );
        assert_same_objects(&on, &served);
    }
}

#[test]
fn replicas_set_the_deployment_and_a_single_replica_has_no_disruption_budget() {
    let three = chart("berth-system", &["replicaCount=3"]);
    assert_eq!(
        object(&three, "Deployment berth-system/berth")["spec"]["replicas"],
        3
    );
    assert_eq!(
        object(&three, "PodDisruptionBudget berth-system/berth")["spec"]["minAvailable"],
        1
    );
    // A budget of one with one replica would block every drain.
    let one = chart("berth-system", &["replicaCount=1"]);
    assert_eq!(
        object(&one, "Deployment berth-system/berth")["spec"]["replicas"],
        1
    );
    assert!(!one.contains_key("PodDisruptionBudget berth-system/berth"));
}

#[test]
fn webhook_url_and_ca_bundle_set_every_client_config() {
    let bundle = "Q0EgYnVuZGxl";
    let local = chart(
        "berth-system",
        &[
            "webhook.url=https://127.0.0.1:8443/",
            &format!("certificates.caBundle={bundle}"),
        ],
    );
    let in_cluster = chart(
        "berth-system",
        &[&format!("certificates.caBundle={bundle}")],
    );
    for (kind, path) in [
        ("MutatingWebhookConfiguration", "/mutate"),
        ("ValidatingWebhookConfiguration", "/validate"),
    ] {
        let key = format!("{kind} /berth");
        for hook in object(&local, &key)["webhooks"].as_array().unwrap() {
            assert_eq!(
                hook["clientConfig"],
                json!({"url": format!("https://127.0.0.1:8443{path}"), "caBundle": bundle})
            );
        }
        for hook in object(&in_cluster, &key)["webhooks"].as_array().unwrap() {
            assert_eq!(
                hook["clientConfig"],
                json!({"service": {"name": "berth", "namespace": "berth-system",
                    "path": path, "port": 443}, "caBundle": bundle})
            );
        }
    }
}

#[test]
fn cert_manager_can_sign_with_an_existing_issuer() {
    let objects = chart(
        "berth-system",
        &[
            "certificates.source=cert-manager",
            "certificates.certManager.issuerRef.kind=ClusterIssuer",
            "certificates.certManager.issuerRef.name=company-ca",
            "certificates.caBundle=ignored",
        ],
    );
    assert!(!objects.contains_key("Issuer berth-system/berth-selfsigned"));
    let certificate = object(&objects, "Certificate berth-system/berth");
    assert_eq!(
        certificate["spec"]["issuerRef"],
        json!({"kind": "ClusterIssuer", "name": "company-ca"})
    );
    // cert-manager's cainjector owns the caBundle: a value given is not used.
    let mutating = object(&objects, "MutatingWebhookConfiguration /berth");
    assert!(mutating["webhooks"][0]["clientConfig"]["caBundle"].is_null());
    assert_eq!(
        mutating["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "berth-system/berth"
    );
}

#[test]
fn image_resources_and_metrics_values_reach_the_pods_and_the_service() {
    let objects = chart(
        "berth-system",
        &[
            "image.repository=registry.example.com/berth",
            "image.tag=1.2.3",
            "image.pullPolicy=Always",
            "resources.limits.memory=512Mi",
            "metrics.port=9191",
            "metrics.podAnnotations.prometheus\\.io/scrape=true",
            "metrics.service.annotations.example\\.com/team=platform",
        ],
    );
    let deployment = object(&objects, "Deployment berth-system/berth");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example.com/berth:1.2.3");
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(
        container["resources"],
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}})
    );
    let env = container["env"].as_array().unwrap();
    let metrics_addr = env
        .iter()
        .find(|e| e["name"] == "BERTH_METRICS_ADDR")
        .expect("BERTH_METRICS_ADDR");
    assert_eq!(metrics_addr["value"], "0.0.0.0:9191");
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "metrics", "containerPort": 9191}))
    );
    assert_eq!(
        pod["metadata"]["annotations"],
        json!({"prometheus.io/scrape": "true"})
    );
    let service = object(&objects, "Service berth-system/berth");
    assert_eq!(
        service["metadata"]["annotations"],
        json!({"example.com/team": "platform"})
    );
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "webhook", "port": 443, "targetPort": "webhook"},
               {"name": "metrics", "port": 9191, "targetPort": "metrics"}])
    );
    let no_metrics = chart("berth-system", &["metrics.service.enabled=false"]);
    assert_eq!(
        object(&no_metrics, "Service berth-system/berth")["spec"]["ports"],
        json!([{"name": "webhook", "port": 443, "targetPort": "webhook"}])
    );
}

/// The environment of berth's container in `objects`.
fn berth_env(objects: &BTreeMap<String, Value>) -> Vec<Value> {
    let deployment = object(objects, "Deployment berth-system/berth");
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn the_client_certificate_and_the_apiservers_addresses_lock_the_webhooks_door() {
    // By default berth takes reviews only with a certificate of the CA in its
    // Secret (`ca.crt`), and the webhook port admits every address but the pod
    // network, which the certificate then locks.
    let defaults = chart(
        "berth-system",
        &["networkPolicy.podCIDRs={10.1.0.0/16,10.2.0.0/16}"],
    );
    assert!(
        berth_env(&defaults)
            .contains(&json!({"name": "BERTH_CLIENT_CA", "value": "/certs/ca.crt"}))
    );
    assert!(
        berth_env(&defaults)
            .contains(&json!({"name": "BERTH_REVIEW_TIMEOUT_SECONDS", "value": "3"}))
    );
    let policy = object(&defaults, "NetworkPolicy berth-system/berth");
    assert_eq!(
        policy["spec"]["ingress"][0]["from"],
        json!([{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.1.0.0/16", "10.2.0.0/16"]}}])
    );

    // A CA of its own, from a ConfigMap.
    let own_ca = chart(
        "berth-system",
        &["clientAuth.ca=-----BEGIN CERTIFICATE-----"],
    );
    assert!(
        berth_env(&own_ca)
            .contains(&json!({"name": "BERTH_CLIENT_CA", "value": "/client-ca/ca.crt"}))
    );
    let ca = object(&own_ca, "ConfigMap berth-system/berth-client-ca");
    assert_eq!(ca["data"]["ca.crt"], "-----BEGIN CERTIFICATE-----");

    // The apiserver's addresses: berth answers no one else, and the port admits
    // only them and the peers given.
    let managed = chart(
        "berth-system",
        &[
            "clientAuth.enabled=false",
            "apiserverCIDRs={172.16.0.2/32,172.16.0.3/32}",
            "networkPolicy.apiserverPeers[0].podSelector.matchLabels.app=konnectivity-agent",
        ],
    );
    let env = berth_env(&managed);
    assert!(env.contains(
        &json!({"name": "BERTH_APISERVER_CIDRS", "value": "172.16.0.2/32,172.16.0.3/32"})
    ));
    assert!(
        !env.iter().any(|e| e["name"] == "BERTH_CLIENT_CA"),
        "{env:?}"
    );
    let policy = object(&managed, "NetworkPolicy berth-system/berth");
    assert_eq!(
        policy["spec"]["ingress"][0]["from"],
        json!([{"ipBlock": {"cidr": "172.16.0.2/32"}}, {"ipBlock": {"cidr": "172.16.0.3/32"}},
            {"podSelector": {"matchLabels": {"app": "konnectivity-agent"}}}])
    );
    let timeout = chart("berth-system", &["webhook.timeoutSeconds=10"]);
    assert!(
        berth_env(&timeout)
            .contains(&json!({"name": "BERTH_REVIEW_TIMEOUT_SECONDS", "value": "10"}))
    );
    let hooks = object(&timeout, "MutatingWebhookConfiguration /berth");
    assert!(
        hooks["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["timeoutSeconds"] == 10)
    );
    let open = chart("berth-system", &["networkPolicy.enabled=false"]);
    assert!(!open.contains_key("NetworkPolicy berth-system/berth"));
}

#[test]
fn values_the_chart_cannot_honour_fail_the_render() {
    for (value, message) in [
        (
            "certificates.source=vault",
            "certificates.source must be secret or cert-manager",
        ),
        (
            "webhook.url=http://127.0.0.1:8443",
            "webhook.url must start with https://",
        ),
        (
            "clientAuth.enabled=false",
            "set apiserverCIDRs or networkPolicy.apiserverPeers",
        ),
        (
            "webhook.timeoutSeconds=31",
            "webhook.timeoutSeconds must be 1 to 30",
        ),
        (
            "placementPolicy.enabled=yes",
            "placementPolicy.enabled must be auto, true or false",
        ),
    ] {
        let out = helm(&["template", "berth", CHART, "--set", value]);
        assert!(!out.status.success(), "{value} rendered");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{value}: {stderr}");
    }
}

/// `berth serve` started by this test, stopped when dropped.
struct LocalBerth(Child);

impl Drop for LocalBerth {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A kubeconfig for the test cluster that acts as `berth-system/berth` through a
/// token, so berth gets exactly what the chart's RBAC grants.
fn service_account_kubeconfig(cluster: &TestCluster) -> PathBuf {
    let token = cluster.kubectl_ok(&[
        "create",
        "token",
        "berth",
        "-n",
        "berth-system",
        "--duration",
        "1h",
    ]);
    let admin = std::fs::read_to_string(cluster.kubeconfig()).expect("kubeconfig");
    let mut config: Value = serde_yaml_ng::from_str(&admin).expect("kubeconfig YAML");
    let cluster_name = config["clusters"][0]["name"].clone();
    config["users"] = json!([{"name": "berth", "user": {"token": token.trim()}}]);
    config["contexts"] =
        json!([{"name": "berth", "context": {"cluster": cluster_name, "user": "berth"}}]);
    config["current-context"] = json!("berth");
    let path = cluster.dir.join("chart-berth.kubeconfig");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).expect("write kubeconfig");
    path
}

/// Waits until node2 is in the cdn pool as far as the scheduler knows: the
/// controller labels (and taints, in the same write) node2, and a probe pod that
/// needs the label is bound only once the scheduler's own node cache has it. The
/// probe runs in berth-system, which berth never sees.
async fn cdn_pool_on_node2(client: &kube::Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(
        &nodes,
        "node2",
        |n: Option<&Node>| {
            n.and_then(|n| n.metadata.labels.as_ref())
                .and_then(|l| l.get(names::POOL_LABEL))
                .is_some_and(|v| v == "cdn")
        },
        WAIT,
    )
    .await;
    let probes: Api<Pod> = Api::namespaced(client.clone(), "berth-system");
    let probe = fixtures::pod("probe-node2")
        .image("busybox")
        .spec(
            json!({"nodeSelector": {"kubernetes.io/hostname": "node2", names::POOL_LABEL: "cdn"},
                 "tolerations": [{"operator": "Exists"}]}),
        )
        .build();
    probes
        .create(&PostParams::default(), &probe)
        .await
        .expect("create probe");
    wait_for(&probes, "probe-node2", is_bound, WAIT).await;
}

fn tolerates_cdn_pool(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key.as_deref() == Some(names::POOL_TAINT) && t.value.as_deref() == Some("cdn")
            })
        })
}

#[tokio::test]
async fn helm_install_runs_seed_000_and_helm_uninstall_removes_the_webhooks() {
    let cluster = TestCluster::shared(NODES);
    let client = cluster.client().await;
    let kubeconfig = cluster.kubeconfig();
    let kubeconfig_arg = kubeconfig.to_str().unwrap();

    // berth's certificate, valid for 127.0.0.1, and a port for it to serve on.
    let certs = cluster.dir.join("chart-certs");
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["certs", "--service", "berth", "--namespace", "berth-system"])
        .arg("--out")
        .arg(&certs)
        .output()
        .expect("run berth certs");
    succeeded("berth certs", out);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();

    // The chart, with the webhooks pointed at the berth this test runs.
    let url = format!("webhook.url=https://127.0.0.1:{port}");
    let bundle = format!("certificates.caBundle={}", certs.join("caBundle").display());
    let install = [
        "install",
        "berth",
        CHART,
        "--kubeconfig",
        kubeconfig_arg,
        "--namespace",
        "berth-system",
        "--create-namespace",
        "--set",
        "replicaCount=0",
        "--set",
        &url,
        "--set-file",
        &bundle,
    ];
    let out = helm_command(Some(&kubeconfig))
        .args(install)
        .output()
        .expect("run helm install");
    succeeded("helm install", out);
    // The test cluster serves MutatingAdmissionPolicy v1: `auto` installed the
    // placement policy, which without a StaticPlacement object does nothing.
    let placement: Api<MutatingAdmissionPolicy> = Api::all(client.clone());
    assert!(
        placement
            .get_opt("berth-placement")
            .await
            .unwrap()
            .is_some(),
        "helm install left out the placement policy on a cluster that serves it"
    );

    // berth as the chart's ServiceAccount, with the chart's RBAC and nothing more.
    let berth_kubeconfig = service_account_kubeconfig(cluster);
    let log = std::fs::File::create(cluster.dir.join("logs/chart-berth.log")).expect("log");
    let mut berth = LocalBerth(
        support::serve_command(
            Path::new(env!("CARGO_BIN_EXE_berth")),
            &certs,
            port,
            "127.0.0.1:0",
            &berth_kubeconfig,
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start berth"),
    );
    let ca = certs.join("ca.crt");
    eventually("berth ready", WAIT, || {
        let exited = berth.0.try_wait().expect("berth status");
        assert!(
            exited.is_none(),
            "berth exited: {exited:?}; see logs/chart-berth.log"
        );
        let out = Command::new("curl")
            .args(["-s", "--max-time", "2", "--cacert"])
            .arg(&ca)
            .arg(format!("https://127.0.0.1:{port}/readyz"))
            .output()
            .expect("curl");
        std::future::ready((out.stdout == b"ok").then_some(()))
    })
    .await;

    // Seed 000: the cdn policy, a namespace opted in (as the README says, with
    // the berth.io/policies annotation), and one that is not.
    let policy = repo_root().join("policies/cdn.yaml");
    cluster.kubectl_ok(&["apply", "-f", policy.to_str().unwrap()]);
    // Small pods, labelled as this test's.
    let pod = |name: &str, image: &str| {
        fixtures::pod(name)
            .image(image)
            .cpu("100m")
            .memory("32Mi")
            .labels(json!({"test": "chart"}))
            .build()
    };
    let opted = fresh_namespace(&client, "chart-cdn").await;
    opt_in(
        &client,
        &opted,
        "cdn",
        &pod("probe", "example/cdn-uploader:1.0"),
        WAIT,
    )
    .await;
    let other = fresh_namespace(&client, "chart-other").await;
    cdn_pool_on_node2(&client).await;

    let mut expected = Vec::new();
    for i in 0..12 {
        let (ns, image, cdn) = match i % 3 {
            0 => (opted.as_str(), "example/cdn-uploader:1.0", true),
            1 => (opted.as_str(), "nginx:1.27", false),
            _ => (other.as_str(), "example/cdn-uploader:1.0", false),
        };
        let name = format!("seed-{i}");
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        pods.create(&PostParams::default(), &pod(&name, image))
            .await
            .expect("create pod");
        expected.push((ns.to_owned(), name, cdn));
    }
    let bound = [
        (
            opted.clone(),
            placed(&client, &opted, "test=chart", 8, WAIT).await,
        ),
        (
            other.clone(),
            placed(&client, &other, "test=chart", 4, WAIT).await,
        ),
    ];
    for (ns, name, cdn) in expected {
        let node = &bound.iter().find(|(n, _)| *n == ns).unwrap().1[&name];
        // The pod as the apiserver admitted it, through the chart's webhook.
        let admitted = Api::<Pod>::namespaced(client.clone(), &ns)
            .get(&name)
            .await
            .expect("get pod");
        if cdn {
            assert_eq!(node, "node2", "cdn pod {ns}/{name}");
            assert!(has_applied(&admitted, "cdn"), "{ns}/{name}: {admitted:?}");
            assert!(tolerates_cdn_pool(&admitted), "{ns}/{name}: {admitted:?}");
        } else {
            assert_ne!(node, "node2", "{ns}/{name} is not entitled to node2");
            assert!(!has_applied(&admitted, "cdn"), "{ns}/{name}");
            assert!(!tolerates_cdn_pool(&admitted), "{ns}/{name}");
        }
    }

    // Uninstalling takes the webhook configurations and the policies with it.
    let uninstall = [
        "uninstall",
        "berth",
        "--kubeconfig",
        kubeconfig_arg,
        "--namespace",
        "berth-system",
        "--wait",
    ];
    let out = helm_command(Some(&kubeconfig))
        .args(uninstall)
        .output()
        .expect("run helm uninstall");
    succeeded("helm uninstall", out);
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    assert!(mutating.get_opt("berth").await.unwrap().is_none());
    assert!(validating.get_opt("berth").await.unwrap().is_none());
    assert!(
        placement
            .get_opt("berth-placement")
            .await
            .unwrap()
            .is_none()
    );
    let left = policies.list(&ListParams::default()).await.unwrap();
    assert!(
        left.items.iter().all(|p| !p
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .starts_with("berth-")),
        "admission policies left: {:?}",
        left.items
            .iter()
            .map(|p| &p.metadata.name)
            .collect::<Vec<_>>()
    );
    drop(berth);
}
