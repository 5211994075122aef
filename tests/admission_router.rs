//! The webhook's router driven with AdmissionReview fixtures, no cluster: uid
//! echo, patchType, 400s, kinds and subresources it leaves alone, pod UPDATE,
//! Namespace and PlacementPolicy validation, what berth cannot read (too large, too
//! deep, out of range), the DaemonSet identity, and readiness.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use berth::admission::body::BodyLimits;
use berth::admission::handlers::{AppState, router};
use berth::admission::server::Caller;
use berth::admission::server::Trust;
use berth::admission::state::BoxFuture;
use berth::admission::state::{ClusterView, FixedView};
use berth::names;
use berth::placement::namespace::NamespaceInfo;
use berth::policy::{PlacementPolicy, PolicySet};
use berth::telemetry::Metrics;
use serde_json::{Value, json};
use support::fixtures::{self, policy};
use tower::ServiceExt;

const MAX_BODY: usize = 64 * 1024;
const BERTH: &str = names::BERTH_SERVICE_ACCOUNT;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/data/admission/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn view() -> FixedView {
    let (policies, errors) = PolicySet::compile(&[policy(
        "cdn",
        json!({"images": ["*cdn*"], "pool": {"nodeNames": ["node2"]}}),
    )]);
    assert!(errors.is_empty());
    let mut default = NamespaceInfo::new("default");
    default
        .annotations
        .insert(names::POLICIES_ANNOTATION.into(), "cdn".into());
    FixedView {
        policies: Arc::new(policies),
        nodes: Arc::default(),
        namespaces: BTreeMap::from([("default".to_string(), Arc::new(default))]),
        groups: Arc::default(),
    }
}

fn state(view: impl ClusterView + 'static, tls_ready: bool) -> Arc<AppState> {
    Arc::new(AppState {
        view: Arc::new(view),
        metrics: Arc::new(Metrics::default()),
        tls_ready: AtomicBool::new(tls_ready),
        limits: BodyLimits::new(MAX_BODY, 1 << 20, std::time::Duration::from_secs(5)),
        berth_user: BERTH.into(),
        trust: Trust::default(),
        review_timeout: std::time::Duration::from_secs(3),
    })
}

async fn post(state: Arc<AppState>, path: &str, body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let response = router(state, 16).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, bytes.to_vec())
}

/// Posts a review and returns its `response`.
async fn review(path: &str, review: &Value) -> Value {
    let (status, body) = post(state(view(), true), path, review.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(
        answer["response"]["uid"], review["request"]["uid"],
        "uid echoed"
    );
    answer["response"].clone()
}

/// A review as the apiserver writes it: `request.uid` first (serde_json would
/// sort the keys, putting it after the object).
fn as_the_apiserver_writes(review: &Value) -> String {
    let mut request = review["request"].clone();
    let uid = request.as_object_mut().unwrap().remove("uid").unwrap();
    let rest = request.to_string();
    format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":{uid},{}"#,
        &rest[1..]
    )
}

fn decoded_patch(response: &Value) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn a_cdn_pod_is_patched_and_the_patch_keeps_unknown_fields() {
    let request = fixture("pod-create.json");
    let response = review("/mutate", &request).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch: json_patch::Patch = serde_json::from_value(decoded_patch(&response)).unwrap();
    let mut pod = request["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    assert_eq!(
        pod["metadata"]["annotations"][names::APPLIED_ANNOTATION],
        "cdn"
    );
    assert_eq!(pod["spec"]["containers"][0]["fieldFromTheFuture"], true);
    assert_eq!(pod["spec"]["tolerations"][0]["tolerationSeconds"], 300);
}

/// With `RUST_LOG=berth=debug`, one review's path is in the log end to end, every
/// line under the review's span with its uid: read, then answered with the policy
/// and the outcome.
#[tokio::test]
async fn a_reviews_path_is_one_span_in_the_log() {
    support::logs::capture();
    let mut request = fixture("pod-create.json");
    request["request"]["uid"] = json!("a-review-followed-by-its-span");
    review("/mutate", &request).await;
    let logged = support::logs::logged();
    let uid = request["request"]["uid"].as_str().unwrap();
    let ours: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("review{path=\"/mutate\"") && l.contains(uid))
        .collect();
    assert!(
        ours.iter()
            .any(|l| l.contains("kind=\"Pod\"") && l.contains(": read bytes=")),
        "{logged}"
    );
    assert!(
        ours.iter()
            .any(|l| l.contains("answered outcome=\"patched\" policies=[\"cdn\"] allowed=true")),
        "{logged}"
    );
}

#[tokio::test]
async fn patch_type_is_set_exactly_when_there_is_a_patch() {
    let mut request = fixture("pod-create.json");
    request["request"]["object"]["spec"]["containers"][0]["image"] = json!("nginx");
    let response = review("/mutate", &request).await;
    assert_eq!(response["allowed"], true);
    assert!(
        response.get("patch").is_none() && response.get("patchType").is_none(),
        "{response}"
    );
}

#[tokio::test]
async fn a_body_that_is_not_a_review_gets_a_400_with_a_reason() {
    for (body, reason) in [
        ("not json", "the body is not an AdmissionReview"),
        (r#"{"kind": "Pod"}"#, "kind must be AdmissionReview"),
        (
            r#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}"#,
            "unsupported AdmissionReview version",
        ),
        (
            r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#,
            "has no request",
        ),
    ] {
        let (status, text) = post(state(view(), true), "/mutate", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            String::from_utf8_lossy(&text).contains(reason),
            "{}",
            String::from_utf8_lossy(&text)
        );
    }
}

#[tokio::test]
async fn other_kinds_and_subresources_are_allowed_unchanged() {
    let mut deployment = fixture("pod-create.json");
    deployment["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    let mut binding = fixture("pod-create.json");
    binding["request"]["subResource"] = json!("binding");
    binding["request"]["object"]["spec"]["nodeName"] = json!("node2");
    for request in [deployment, binding] {
        for path in ["/mutate", "/validate"] {
            let response = review(path, &request).await;
            assert_eq!(response["allowed"], true);
            assert!(response.get("patch").is_none());
        }
    }
}

#[tokio::test]
async fn a_node_name_on_a_dedicated_node_is_denied_with_the_reason() {
    let mut request = fixture("pod-create.json");
    request["request"]["object"]["spec"]["containers"][0]["image"] = json!("nginx");
    request["request"]["object"]["spec"]["nodeName"] = json!("node2");
    for path in ["/mutate", "/validate"] {
        let response = review(path, &request).await;
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 403);
        assert!(
            response["status"]["message"]
                .as_str()
                .unwrap()
                .contains("dedicated pool cdn")
        );
    }
}

#[tokio::test]
async fn a_pod_update_that_adds_a_pool_toleration_is_denied() {
    let mut update = fixture("pod-create.json");
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["object"]["spec"]["containers"][0]["image"] = json!("nginx");
    let old = update["request"]["object"].clone();
    update["request"]["oldObject"] = old;
    // An update that changes nothing berth cares about is fine.
    assert_eq!(review("/validate", &update).await["allowed"], true);
    update["request"]["object"]["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}));
    let response = review("/validate", &update).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("not entitled to pool cdn")
    );
}

#[tokio::test]
async fn a_pod_update_may_not_drop_berths_node_affinity() {
    let mut update = fixture("pod-create.json");
    update["request"]["operation"] = json!("UPDATE");
    let mut old = update["request"]["object"].clone();
    old["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": names::anchor_label("redis"), "operator": "DoesNotExist"}]}]}}});
    update["request"]["oldObject"] = old;
    let response = review("/validate", &update).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("may not be removed")
    );
}

fn namespace_review(annotations: Value) -> Value {
    let mut request = fixture("pod-create.json");
    request["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Namespace"});
    request["request"]["namespace"] = json!(null);
    request["request"]["object"] = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "team", "annotations": annotations}});
    request
}

#[tokio::test]
async fn namespace_annotations_are_validated() {
    let response = review(
        "/validate",
        &namespace_review(json!({names::POLICIES_ANNOTATION: "cdn,,gpu"})),
    )
    .await;
    assert_eq!(response["allowed"], false);
    assert_eq!(
        response["status"]["message"],
        format!(
            "annotation {}: entry 2 is empty (write names separated by commas)",
            names::POLICIES_ANNOTATION
        )
    );
    let response = review(
        "/validate",
        &namespace_review(json!({names::POLICIES_ANNOTATION: "cdn, gpu"})),
    )
    .await;
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response["warnings"],
        json!(["no PlacementPolicy named \"gpu\" exists (yet)"])
    );
}

fn policy_review(name: &str, spec: Value) -> Value {
    let mut request = fixture("pod-create.json");
    request["request"]["kind"] =
        json!({"group": names::GROUP, "version": "v1alpha1", "kind": "PlacementPolicy"});
    request["request"]["namespace"] = json!(null);
    request["request"]["object"] = serde_json::to_value(policy(name, spec)).unwrap();
    request
}

#[tokio::test]
async fn a_webhook_probe_is_answered_with_a_refusal_and_never_stored() {
    // The controller's probe of the webhook path: a policy carrying the probe
    // annotation, valid or not, is refused with berth's answer.
    for spec in [
        json!({"images": ["berth-webhook-probe"], "schedulerName": "s"}),
        json!({"images": ["[bad"]}),
    ] {
        let mut request = policy_review("probe", spec);
        request["request"]["object"]["metadata"]["annotations"] =
            json!({names::WEBHOOK_PROBE_ANNOTATION: "dry run"});
        let response = review("/validate", &request).await;
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["message"], names::WEBHOOK_PROBE_ANSWER);
    }
}

#[tokio::test]
async fn placement_policies_are_validated_beyond_the_schema() {
    let response = review(
        "/validate",
        &policy_review("bad", json!({"images": ["[cdn"], "schedulerName": "s"})),
    )
    .await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("policy bad: images: bad image glob")
    );

    let response = review(
        "/validate",
        &policy_review("edge", json!({"pool": {"nodeNames": ["node2", "node3"]}})),
    )
    .await;
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response["warnings"],
        json!(["node node2 is also in pool cdn; the older policy keeps it"])
    );

    // A pool selector on a label a node can set on itself is allowed, and said.
    let by_role = json!({"matchLabels": {"role": "gpu"}});
    let response = review(
        "/validate",
        &policy_review("gpu", json!({"pool": {"nodeSelector": by_role}})),
    )
    .await;
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response["warnings"],
        json!([
            "pool.nodeSelector: no new node joins by labels nodes set themselves \
             (pool.trustSelfSetLabels): role"
        ])
    );
    let response = review(
        "/validate",
        &policy_review(
            "gpu",
            json!({"pool": {"nodeSelector": by_role, "trustSelfSetLabels": true}}),
        ),
    )
    .await;
    assert_eq!(
        response["warnings"],
        json!(["pool.trustSelfSetLabels: a node can join this pool by setting on itself role"])
    );
    let restricted = json!({"matchLabels": {"node-restriction.kubernetes.io/gpu": "a100"}});
    let response = review(
        "/validate",
        &policy_review("gpu", json!({"pool": {"nodeSelector": restricted}})),
    )
    .await;
    assert_eq!(response["warnings"], Value::Null, "{response}");
}

/// The reason of a review answered by a denial that echoes `request`'s uid: a 4xx
/// would count as a webhook failure and let the pod through.
fn denied_by_uid(status: StatusCode, body: &[u8], request: &Value) -> String {
    assert_eq!(status, StatusCode::OK, "a 4xx would let the pod through");
    let answer: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(answer["response"]["uid"], request["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], false);
    answer["response"]["status"]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_review_over_the_cap_is_denied_by_its_uid_and_anything_else_gets_413() {
    let mut request = fixture("pod-create.json");
    request["request"]["object"]["spec"]["containers"][0]["env"] =
        json!([{"name": "X", "value": "<".repeat(MAX_BODY)}]);
    let (status, body) = post(
        state(view(), true),
        "/mutate",
        as_the_apiserver_writes(&request),
    )
    .await;
    let message = denied_by_uid(status, &body, &request);
    assert!(
        message.contains("cannot check what it does not read"),
        "{message}"
    );

    let (status, _) = post(state(view(), true), "/mutate", vec![b' '; MAX_BODY + 1]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "no uid to answer");
}

/// A review small enough to be read at once, but whose JSON would cost more than a
/// request may hold for free, is not read at once: it is costed, charged to the
/// budget, and here, where it costs more than the whole budget, refused. (A node
/// selector of lists of empty objects: each is an item that may cost a slot.)
#[tokio::test]
async fn a_small_review_that_would_cost_more_than_the_budget_is_refused_unread() {
    let mut request = fixture("pod-create.json");
    let costly: serde_json::Map<String, Value> = (0..500)
        .map(|i| (format!("k{i}"), Value::Array(vec![json!({}); 20])))
        .collect();
    request["request"]["object"]["spec"]["nodeSelector"] = Value::Object(costly);
    // Whole, as the apiserver writes it.
    let body = as_the_apiserver_writes(&request) + "}";
    assert!(
        body.len() < MAX_BODY,
        "{} bytes: within the cap",
        body.len()
    );
    let (status, body) = post(state(view(), true), "/mutate", body).await;
    let message = denied_by_uid(status, &body, &request);
    assert!(
        message.contains("whose JSON takes about 2 MiB to read"),
        "{message}"
    );
}

#[tokio::test]
async fn managed_fields_berth_cannot_parse_do_not_hide_the_pod() {
    let mut deep = json!({});
    for _ in 0..140 {
        deep = json!({ "f:x": deep });
    }
    let mut request = fixture("pod-create.json");
    let pod = &mut request["request"]["object"];
    pod["spec"]["containers"][0]["image"] = json!("nginx");
    pod["spec"]["nodeName"] = json!("node2");
    pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    pod["metadata"]["managedFields"] = json!([
        {"manager": "x", "operation": "Apply", "time": "9999-12-31T23:59:59Z", "fieldsType": "FieldsV1", "fieldsV1": deep}]);
    // serde_json's own recursion limit is 128: build the body by hand.
    let body = serde_json::to_string(&request).unwrap();
    for path in ["/mutate", "/validate"] {
        let (status, answer) = post(state(view(), true), path, body.clone()).await;
        assert_eq!(status, StatusCode::OK);
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("dedicated pool cdn"), "{message}");
    }
}

#[tokio::test]
async fn a_pod_too_deep_to_read_is_denied_with_the_reason() {
    let mut request = fixture("pod-create.json");
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    // In a field of the pod spec berth reads; the same depth elsewhere in the spec
    // or in a container's details (env, probes, unknown fields) is skipped unread
    // and cannot fail it.
    let body = request.to_string().replacen(
        r#""containers":"#,
        &format!(r#""nodeSelector":{deep},"containers":"#),
        1,
    );
    assert_ne!(body, request.to_string());
    request["request"]["uid"] = json!("705ab4f5-6393-11e8-b7cc-42010a800002");
    let (status, answer) = post(state(view(), true), "/mutate", body).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["response"]["uid"], request["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("berth cannot read this Pod: the object: recursion limit"),
        "{message}"
    );
}

#[tokio::test]
async fn a_detail_too_deep_where_berth_does_not_read_is_skipped_unread() {
    let request = fixture("pod-create.json");
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    // In a container's details, and in a field of the spec berth does not read.
    let body = request
        .to_string()
        .replacen(
            r#""fieldFromTheFuture":true"#,
            &format!(r#""fieldFromTheFuture":{deep}"#),
            1,
        )
        .replacen(
            r#""containers":"#,
            &format!(r#""volumes":{deep},"containers":"#),
            1,
        );
    assert_eq!(body.matches(&deep).count(), 2);
    let (status, answer) = post(state(view(), true), "/mutate", body).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
}

fn pod_update(user: &str, change: impl Fn(&mut Value)) -> Value {
    let mut update = fixture("pod-create.json");
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["userInfo"]["username"] = json!(user);
    let pod = &mut update["request"]["object"];
    pod["spec"]["containers"][0]["image"] = json!("nginx");
    pod["metadata"]["annotations"] = json!({names::APPLIED_ANNOTATION: "redis"});
    pod["spec"]["schedulingGates"] = json!([{"name": names::AVOID_GATE}]);
    update["request"]["oldObject"] = update["request"]["object"].clone();
    change(&mut update["request"]["object"]);
    update
}

#[tokio::test]
async fn only_berth_changes_its_record_and_gates_and_only_kubernetes_controllers_a_pods_controller()
{
    type Forge = fn(&mut Value);
    let forgeries: [(&str, Forge); 3] = [
        (names::APPLIED_ANNOTATION, |pod| {
            pod["metadata"]["annotations"][names::APPLIED_ANNOTATION] = json!("cdn")
        }),
        (names::AVOID_GATE, |pod| {
            pod["spec"]["schedulingGates"] = json!([])
        }),
        ("ownerReference", |pod| {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "x", "uid": "u", "controller": true}])
        }),
    ];
    for (what, forge) in forgeries {
        let response = review("/validate", &pod_update("tenant", forge)).await;
        assert_eq!(response["allowed"], false, "{what}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{message}");
    }
    let release = pod_update(BERTH, |pod| pod["spec"]["schedulingGates"] = json!([]));
    assert_eq!(review("/validate", &release).await["allowed"], true);
    let adopt = pod_update(
        "system:serviceaccount:kube-system:replicaset-controller",
        |pod| {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "x", "uid": "u", "controller": true}])
        },
    );
    assert_eq!(review("/validate", &adopt).await["allowed"], true);
}

#[tokio::test]
async fn a_forged_daemonset_owner_reference_earns_no_pool_toleration() {
    let mut request = fixture("pod-create.json");
    let pod = &mut request["request"]["object"];
    pod["spec"]["containers"][0]["image"] = json!("nginx");
    pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "redteam.example.com/v1",
        "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]);
    pod["spec"]["nodeName"] = json!("node2");
    let response = review("/mutate", &request).await;
    assert_eq!(response["allowed"], false);
    // Even an apps/v1 DaemonSet owner counts only from the DaemonSet controller.
    request["request"]["object"]["metadata"]["ownerReferences"][0]["apiVersion"] = json!("apps/v1");
    let response = review("/mutate", &request).await;
    assert_eq!(response["allowed"], false, "{response}");
    request["request"]["userInfo"]["username"] =
        json!("system:serviceaccount:kube-system:daemon-set-controller");
    let response = review("/mutate", &request).await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn readyz_waits_for_tls_and_synced_caches() {
    let app_state = state(view(), false);
    let get = |state: Arc<AppState>| async move {
        let request = Request::get("/readyz").body(Body::empty()).unwrap();
        router(state, 16).oneshot(request).await.unwrap().status()
    };
    assert_eq!(
        get(app_state.clone()).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    app_state.tls_ready.store(true, Ordering::Release);
    assert_eq!(get(app_state).await, StatusCode::OK);
}

#[tokio::test]
async fn an_unknown_namespace_gets_no_grants_and_a_warning() {
    let mut request = fixture("pod-create.json");
    request["request"]["namespace"] = json!("elsewhere");
    let response = review("/mutate", &request).await;
    assert!(response.get("patch").is_none());
    assert_eq!(
        response["warnings"][0],
        "berth could not read namespace elsewhere; the pod gets no grants"
    );
}

#[tokio::test]
async fn daemonset_templates_get_the_tolerations_of_pools_that_let_daemonsets_run() {
    let mut request = fixture("pod-create.json");
    request["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "DaemonSet"});
    request["request"]["object"] = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent"}},
                              "spec": {"containers": [{"name": "a", "image": "fluent-bit"}]}}}});
    let response = review("/mutate", &request).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(
        decoded_patch(&response),
        json!([{"op": "add", "path": "/spec/template/spec/tolerations",
        "value": [{"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}]}])
    );
}

#[tokio::test]
async fn a_daemonset_that_tolerates_everything_is_kept_off_pools_that_do_not_take_it() {
    let (policies, _) = PolicySet::compile(&[policy(
        "edge",
        json!({"pool": {"nodeNames": ["node3"], "daemonSets": "Exclude"}}),
    )]);
    let view = FixedView {
        policies: Arc::new(policies),
        nodes: Arc::default(),
        namespaces: BTreeMap::from([(
            "default".to_string(),
            Arc::new(NamespaceInfo::new("default")),
        )]),
        groups: Arc::default(),
    };
    let mut request = fixture("pod-create.json");
    request["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "DaemonSet"});
    request["request"]["object"] = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "default"},
        "spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "a", "image": "fluent-bit"}]}}}});
    let (status, body) = post(state(view, true), "/mutate", request.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        decoded_patch(&response["response"]),
        json!([{"op": "add", "path": "/spec/template/spec/affinity", "value": {"nodeAffinity":
            {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms":
             [{"matchExpressions": [{"key": names::POOL_LABEL, "operator": "NotIn", "values": ["edge"]}]}]}}}}])
    );
}

/// A view with a queue policy `queue` (maxPriority 10) and another, `other`,
/// that `default` opts into only when `opted`; the classes that exist are those
/// the controller makes for `queue`.
fn queue_view(opted: &str) -> FixedView {
    let (policies, errors) = PolicySet::compile(&[
        policy("queue", json!({"queue": {}})),
        policy(
            "other",
            json!({"queue": {}, "podSelector": {"matchLabels": {"never": "x"}}}),
        ),
    ]);
    assert!(errors.is_empty());
    let mut default = NamespaceInfo::new("default");
    default
        .annotations
        .insert(names::POLICIES_ANNOTATION.into(), opted.into());
    let groups = berth::admission::state::GroupState {
        queue_classes: (0..=32).map(|v| names::queue_class("queue", v)).collect(),
        ..Default::default()
    };
    FixedView {
        policies: Arc::new(policies),
        nodes: Arc::default(),
        namespaces: BTreeMap::from([("default".to_string(), Arc::new(default))]),
        groups: Arc::new(groups),
    }
}

#[tokio::test]
async fn queue_classes_are_the_controllers_and_a_review_makes_berth_write_nothing() {
    let mut request = fixture("pod-create.json");
    request["request"]["object"]["metadata"]["labels"]["groupPriority"] = json!("3");
    let answer = |view: FixedView, request: Value| async move {
        let (_, body) = post(state(view, true), "/mutate", request.to_string()).await;
        serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
    };
    // The class the controller made for the policy: 3 x 3 + BestEffort.
    let response = answer(queue_view("queue"), request.clone()).await;
    let patch = decoded_patch(&response).to_string();
    assert!(patch.contains(&names::queue_class("queue", 9)), "{patch}");
    // A label above the policy's ceiling counts as the ceiling, with a warning:
    // no class above 3 x 10 + 2 exists or is named.
    request["request"]["object"]["metadata"]["labels"]["groupPriority"] = json!("1000000");
    let response = answer(queue_view("queue"), request.clone()).await;
    assert!(
        decoded_patch(&response)
            .to_string()
            .contains(&names::queue_class("queue", 30))
    );
    assert!(
        response["warnings"]
            .to_string()
            .contains("counts as its maxPriority 10")
    );
    // A class the controller has not made (here: none for `other`) is not made on
    // behalf of a review: the view has no way to write, and the webhook asks none.
    let response = answer(queue_view("other"), request.clone()).await;
    assert_eq!(response["allowed"], true);
    assert!(
        response.get("patch").is_none()
            || !decoded_patch(&response).to_string().contains("priority")
    );
}

#[tokio::test]
async fn a_pod_may_not_name_the_queue_class_of_a_policy_its_namespace_does_not_opt_into() {
    let mut request = fixture("pod-create.json");
    request["request"]["object"]["spec"]["priorityClassName"] =
        json!(names::queue_class("queue", 30));
    let (_, body) = post(state(queue_view(""), true), "/mutate", request.to_string()).await;
    let response = serde_json::from_slice::<Value>(&body).unwrap()["response"].clone();
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("orders policy queue's queue, which namespace default does not opt into"),
        "{response}"
    );
    // Opted in, the pod's labels decide its class (here it has none: it keeps
    // the one it names).
    let (_, body) = post(
        state(queue_view("queue"), true),
        "/mutate",
        request.to_string(),
    )
    .await;
    let response = serde_json::from_slice::<Value>(&body).unwrap()["response"].clone();
    assert_eq!(response["allowed"], true);
}

/// The nodes, policy and namespaces of tests/data/semantics, as the webhook's
/// caches would hold them.
fn semantics_view() -> FixedView {
    let dir = format!("{}/tests/data/semantics", env!("CARGO_MANIFEST_DIR"));
    let read = |file: &str| -> Value {
        serde_yaml_ng::from_str(&std::fs::read_to_string(format!("{dir}/{file}")).unwrap()).unwrap()
    };
    let edge: PlacementPolicy = serde_json::from_value(read("edge.yaml")).unwrap();
    let (policies, errors) = PolicySet::compile(&[edge]);
    assert!(errors.is_empty());
    let nodes = read("nodes.yaml")["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(n.clone()).unwrap();
            let info = berth::objects::NodeInfo::from_node(&node);
            (node.metadata.name.unwrap(), Arc::new(info))
        })
        .collect();
    let namespaces = ["tenant.yaml", "opted-in.yaml"]
        .iter()
        .map(|file| {
            let ns: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(read(file)).unwrap();
            let info = NamespaceInfo::from_namespace(&ns);
            (info.name.clone(), Arc::new(info))
        })
        .collect();
    FixedView {
        policies: Arc::new(policies),
        nodes: Arc::new(nodes),
        namespaces,
        groups: Arc::default(),
    }
}

#[tokio::test]
async fn berth_mutate_with_nodes_decides_as_the_webhook_does() {
    let daemonset_owner = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": true}]);
    let pinned = |node: &str| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}})
    };
    // (namespace, labels, spec, ownerReferences)
    let pods = [
        ("shop", json!({"tier": "edge"}), json!({}), Value::Null),
        (
            "shop",
            json!({"tier": "edge"}),
            json!({"nodeName": "e1"}),
            Value::Null,
        ),
        ("tenant", json!({}), json!({"nodeName": "e1"}), Value::Null),
        (
            "tenant",
            json!({}),
            json!({"tolerations": [{"operator": "Exists"}]}),
            Value::Null,
        ),
        (
            "tenant",
            json!({}),
            json!({"tolerations": [{"key": names::POOL_TAINT, "operator": "Gt", "value": "1"}]}),
            Value::Null,
        ),
        (
            "tenant",
            json!({}),
            json!({"tolerations": [{"operator": "Exists"}], "affinity": pinned("e1")}),
            daemonset_owner.clone(),
        ),
        (
            "tenant",
            json!({}),
            json!({"tolerations": [{"operator": "Exists"}], "affinity": pinned("w1")}),
            daemonset_owner,
        ),
        (
            "shop",
            json!({"tier": "edge"}),
            json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}),
            Value::Null,
        ),
    ];
    for (i, (namespace, labels, spec, owners)) in pods.into_iter().enumerate() {
        let daemonset = !owners.is_null();
        let mut pod = fixtures::pod(&format!("p{i}"))
            .image("nginx")
            .metadata(json!({"namespace": namespace}))
            .labels(labels)
            .spec(spec);
        if daemonset {
            pod = pod.owners(owners);
        }
        let pod = pod.json();
        let mut request = fixture("pod-create.json");
        request["request"]["namespace"] = json!(namespace);
        request["request"]["object"] = pod.clone();
        if daemonset {
            request["request"]["userInfo"]["username"] =
                json!("system:serviceaccount:kube-system:daemon-set-controller");
        }
        let (status, body) = post(
            state(semantics_view(), true),
            "/mutate",
            request.to_string(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let webhook: Value = serde_json::from_slice::<Value>(&body).unwrap()["response"].clone();

        let dir = format!("{}/tests/data/semantics", env!("CARGO_MANIFEST_DIR"));
        let namespace_file = if namespace == "shop" {
            "opted-in.yaml"
        } else {
            "tenant.yaml"
        };
        let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["mutate", "-f", "-", "-o", "patch"])
            .args(["--policies", &format!("{dir}/edge.yaml")])
            .args(["--namespace", &format!("{dir}/{namespace_file}")])
            .args(["--nodes", &format!("{dir}/nodes.yaml")])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        cli.stdin
            .take()
            .unwrap()
            .write_all(pod.to_string().as_bytes())
            .unwrap();
        let out = cli.wait_with_output().unwrap();
        let allowed = webhook["allowed"] == true;
        assert_eq!(
            out.status.success(),
            allowed,
            "pod {i}: {pod}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if allowed {
            let patch: Value = serde_json::from_slice(&out.stdout).unwrap();
            let from_webhook = if webhook.get("patch").is_some() {
                decoded_patch(&webhook)
            } else {
                json!([])
            };
            assert_eq!(patch, from_webhook, "pod {i}: {pod}");
        } else {
            let reason = webhook["status"]["message"].as_str().unwrap();
            assert!(
                String::from_utf8_lossy(&out.stderr).contains(reason),
                "pod {i}: {reason}"
            );
        }
    }
}

/// A request to `path?query` whose body never finishes: it sends `first` and then
/// nothing, as a slow or hostile client would.
fn stalled(path: &str, first: &'static str, certified: bool) -> Request<Body> {
    use futures::StreamExt;
    let chunks = futures::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::from(first))])
        .chain(futures::stream::pending());
    let mut request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from_stream(chunks))
        .unwrap();
    request.extensions_mut().insert(caller(certified));
    request
}

fn caller(certified: bool) -> Caller {
    Caller {
        addr: [127, 0, 0, 1].into(),
        certified,
    }
}

/// The fixture's view, but a lookup of namespace `stuck` never ends: a review in
/// it holds its turn until its deadline.
struct StuckNamespace(FixedView);

impl ClusterView for StuckNamespace {
    fn policies(&self) -> Arc<PolicySet> {
        self.0.policies()
    }
    fn nodes(&self) -> Arc<berth::objects::NodeIndex> {
        self.0.nodes()
    }
    fn namespace<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<Arc<NamespaceInfo>>> {
        if name == "stuck" {
            return Box::pin(futures::future::pending());
        }
        self.0.namespace(name)
    }
    fn synced(&self) -> bool {
        true
    }
    fn groups(&self) -> Arc<berth::admission::state::GroupState> {
        self.0.groups()
    }
}

/// What `response` answered: its status and, for a review, the review.
async fn answered(response: axum::response::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test(start_paused = true)]
async fn slow_clients_hold_no_turn_and_no_review_waits_past_berths_own_deadline() {
    let mut with_ca = Arc::try_unwrap(state(StuckNamespace(view()), true))
        .ok()
        .unwrap();
    with_ca.trust.client_certificate = true;
    let app = router(Arc::new(with_ca), 1);
    let pod = fixture("pod-create.json");
    let request = |body: String, query: &str| {
        let mut request = Request::post(format!("/mutate?{query}"))
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        request.extensions_mut().insert(caller(true));
        request
    };
    // Strangers who never finish their bodies, all at once: each is refused at
    // the door (what it sends dropped unread, for at most a second), and no turn
    // is taken.
    let strangers: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(
                app.clone()
                    .oneshot(stalled("/mutate?timeout=30s", "{", false)),
            )
        })
        .collect();
    for stranger in strangers {
        let (status, _) = answered(stranger.await.unwrap().unwrap()).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    // Clients with the certificate that send headers and never the body (the
    // attack needs no certificate where none is required): they hold no turn,
    // however long a timeout they ask for.
    let head = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"slow-1","#;
    let slow: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(
                app.clone()
                    .oneshot(stalled("/mutate?timeout=30s", head, true)),
            )
        })
        .collect();
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    let response = app
        .clone()
        .oneshot(request(pod.to_string(), "timeout=3s"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        started.elapsed() < std::time::Duration::from_millis(100),
        "the apiserver's review waited {:?} behind bodies that never came",
        started.elapsed()
    );
    // Each is answered by berth's own deadline (2 s of the 3 s it is configured
    // with), not the 20 s of the 30 s it asked for: denied by its uid.
    for slow in slow {
        let (status, answer) = answered(slow.await.unwrap().unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["response"]["uid"], "slow-1");
        assert_eq!(answer["response"]["allowed"], false);
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("did not arrive in time"), "{message}");
    }
    assert_eq!(started.elapsed(), std::time::Duration::from_secs(2));

    // A review whose namespace lookup never ends holds the only turn until its
    // deadline; the next one, with a shorter timeout, waits for it no longer than
    // its own deadline and is refused by its uid while the apiserver still
    // listens.
    let mut stuck = pod.clone();
    stuck["request"]["namespace"] = json!("stuck");
    stuck["request"]["object"]["metadata"]["namespace"] = json!("stuck");
    let holder = tokio::spawn(
        app.clone()
            .oneshot(request(stuck.to_string(), "timeout=3s")),
    );
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    let response = app
        .clone()
        .oneshot(request(pod.to_string(), "timeout=1s"))
        .await
        .unwrap();
    let waited = started.elapsed();
    let (_, answer) = answered(response).await;
    assert_eq!(answer["response"]["uid"], pod["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("could not decide in time"),
        "{answer}"
    );
    assert_eq!(
        waited,
        std::time::Duration::from_millis(500),
        "half a second of its 1 s, no more"
    );
    holder.abort();
}

/// With `--apiserver-cidrs`, a review from any other address gets the 403 a
/// client without the certificate gets, the same whatever namespace it names;
/// the apiserver's addresses are answered.
#[tokio::test]
async fn with_apiserver_cidrs_only_those_addresses_send_reviews() {
    let mut by_address = Arc::try_unwrap(state(view(), true)).ok().unwrap();
    by_address.trust.addresses = vec!["127.0.0.1/32".parse().unwrap()];
    let app = router(Arc::new(by_address), 4);
    let from = |addr: [u8; 4], namespace: &str| {
        let mut pod = fixture("pod-create.json");
        pod["request"]["namespace"] = json!(namespace);
        let mut request = Request::post("/mutate")
            .header("content-type", "application/json")
            .body(Body::from(pod.to_string()))
            .unwrap();
        request.extensions_mut().insert(Caller {
            addr: addr.into(),
            certified: false,
        });
        request
    };
    let (status, _) = answered(
        app.clone()
            .oneshot(from([127, 0, 0, 1], "default"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the apiserver's address");
    let refused = |namespace: &'static str| {
        let app = app.clone();
        async move {
            let response = app.oneshot(from([127, 0, 0, 2], namespace)).await.unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, body)
        }
    };
    let opted = refused("default").await;
    assert_eq!(opted.0, StatusCode::FORBIDDEN);
    assert_eq!(
        refused("elsewhere").await,
        opted,
        "nothing tells namespaces apart"
    );
}
