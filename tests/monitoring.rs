//! `monitoring/`: every query of the alert rules and the Grafana dashboard parses as
//! PromQL and names only metrics (and labels) berth exports, as berth's own registry
//! encodes them; the rule file has what an on-call engineer needs on every alert;
//! and the dashboard shows every metric berth exports.
//!
//! A renamed metric would otherwise leave alerts that never fire and panels that
//! stay empty, with nothing to say so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use berth::names;
use berth::telemetry::{GateLabels, KindLabels, Metrics, PolicyLabels, RequestLabels, WriteLabels};
use promql_parser::label::{MatchOp, Matchers};
use promql_parser::parser::{self, Expr, VectorSelector};
use promql_parser::util::{ExprVisitor, parse_duration, walk_expr};
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Labels a scrape adds to every series (Prometheus itself, and the Kubernetes
/// service discovery of the Prometheus Operator), which queries may use.
const TARGET_LABELS: [&str; 7] = [
    "job",
    "instance",
    "namespace",
    "pod",
    "service",
    "endpoint",
    "container",
];

/// What berth exports: each series name with the label names it carries.
struct Exported {
    series: BTreeMap<String, BTreeSet<String>>,
    /// The metric families (names as in `# TYPE`), for the dashboard's coverage.
    families: BTreeSet<String>,
}

impl Exported {
    /// Encodes berth's own registry. Families that have no series until something
    /// happens get one first, so that their labels show; the series names come from
    /// the `# TYPE` lines, with the suffixes the text format gives each type.
    fn from_berth() -> Exported {
        let metrics = Metrics::default();
        let request = RequestLabels {
            path: "/mutate".into(),
            outcome: "patched".into(),
        };
        metrics.latency.get_or_create(&request).observe(0.001);
        let policy = PolicyLabels {
            policy: "cdn".into(),
        };
        metrics.decisions.get_or_create(&policy).inc();
        metrics
            .unentitled_pods
            .set_all(&[("cdn".to_string(), 0)].into());
        metrics
            .missed_pods
            .set_all(&[("cdn".to_string(), 0)].into());
        metrics
            .exclusion_clashes
            .set_all(&[("cdn".to_string(), 0)].into());
        metrics.missed_evictions.get_or_create(&policy).inc();
        let kind = KindLabels {
            kind: "busy".into(),
        };
        metrics.denials.get_or_create(&kind).inc();
        metrics.errors.get_or_create(&kind).inc();
        metrics.node_writes.get_or_create(&kind).inc();
        metrics.connections_dropped.get_or_create(&kind).inc();
        let write = WriteLabels {
            kind: "node".into(),
            outcome: "ok".into(),
        };
        metrics.controller_writes.get_or_create(&write).inc();
        metrics
            .controller_write_seconds
            .get_or_create(&kind)
            .observe(0.01);
        metrics.set_held(
            names::AVOID_GATE,
            std::iter::empty(),
            k8s_openapi::jiff::Timestamp::now(),
        );
        let gate = GateLabels::new(names::AVOID_GATE);
        metrics.gated_seconds.get_or_create(&gate).observe(1.0);
        let text = metrics.encode();

        let mut families = BTreeSet::new();
        let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
                families.insert(name.to_string());
                let suffixes: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    "gauge" => &[""],
                    other => panic!("berth exports a {other} ({name}): teach this test its series"),
                };
                for suffix in suffixes {
                    series.entry(format!("{name}{suffix}")).or_default();
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let name_end = line.find(['{', ' ']).unwrap_or(line.len());
                let labels = series.entry(line[..name_end].to_string()).or_default();
                if let Some(inner) = line[name_end..]
                    .strip_prefix('{')
                    .and_then(|l| l.split_once('}'))
                {
                    for pair in inner.0.split(',').filter(|p| !p.is_empty()) {
                        labels.insert(pair.split_once('=').unwrap().0.to_string());
                    }
                }
            }
        }
        assert!(
            series.contains_key("berth_admission_duration_seconds_bucket"),
            "the registry did not encode as expected:\n{text}"
        );
        Exported { series, families }
    }

    fn all_labels(&self) -> BTreeSet<String> {
        let mut all: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        all.extend(self.series.values().flatten().cloned());
        all
    }
}

/// Every metric name and label name a query uses.
#[derive(Default)]
struct Uses {
    /// Each selector's metric and the labels its matchers name.
    selectors: Vec<(String, Vec<String>)>,
    /// Labels named in `by`/`without`, `on`/`ignoring` and `group_left/right`.
    grouping: Vec<String>,
    /// Selectors without a metric name, which this test cannot check.
    nameless: Vec<String>,
}

impl Uses {
    fn selector(&mut self, vs: &VectorSelector) {
        let matchers = |m: &Matchers| -> Vec<String> {
            m.matchers
                .iter()
                .chain(m.or_matchers.iter().flatten())
                .map(|m| m.name.clone())
                .filter(|n| n != "__name__")
                .collect()
        };
        // `{__name__="x"}` names its metric as `x` does; a regex on the name does not.
        let by_matcher = vs.matchers.matchers.iter().find_map(|m| {
            (m.name == "__name__" && matches!(m.op, MatchOp::Equal)).then(|| m.value.clone())
        });
        match vs.name.clone().or(by_matcher) {
            Some(name) => self.selectors.push((name, matchers(&vs.matchers))),
            None => self.nameless.push(vs.to_string()),
        }
    }
}

impl ExprVisitor for Uses {
    type Error = ();

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, ()> {
        match expr {
            Expr::VectorSelector(vs) => self.selector(vs),
            Expr::MatrixSelector(ms) => self.selector(&ms.vs),
            Expr::Aggregate(agg) => {
                if let Some(modifier) = &agg.modifier {
                    self.grouping
                        .extend(modifier.labels().labels.iter().cloned());
                }
            }
            Expr::Binary(binary) => {
                if let Some(modifier) = &binary.modifier {
                    if let Some(matching) = &modifier.matching {
                        self.grouping
                            .extend(matching.labels().labels.iter().cloned());
                    }
                    if let Some(labels) = modifier.card.labels() {
                        self.grouping.extend(labels.labels.iter().cloned());
                    }
                }
            }
            _ => {}
        }
        Ok(true)
    }
}

/// Parses `expr` (from `what`) and returns the problems with it: a parse error, or
/// a metric or label berth does not export.
fn check_query(what: &str, expr: &str, exported: &Exported) -> Vec<String> {
    let parsed = match parser::parse(expr) {
        Ok(parsed) => parsed,
        Err(e) => return vec![format!("{what}: does not parse as PromQL: {e}\n  {expr}")],
    };
    let mut uses = Uses::default();
    walk_expr(&mut uses, &parsed).expect("the visitor never fails");
    let mut problems = Vec::new();
    if uses.selectors.is_empty() {
        problems.push(format!("{what}: reads no metric\n  {expr}"));
    }
    for selector in &uses.nameless {
        problems.push(format!(
            "{what}: selector {selector} has no metric name to check"
        ));
    }
    for (name, labels) in &uses.selectors {
        let Some(known) = exported.series.get(name) else {
            problems.push(format!(
                "{what}: berth exports no metric {name} (it exports {})",
                exported
                    .series
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        };
        for label in labels {
            let ok = known.contains(label) || TARGET_LABELS.contains(&label.as_str());
            if !ok {
                problems.push(format!(
                    "{what}: {name} has no label {label:?} (it has {known:?} and the scrape's)"
                ));
            }
        }
    }
    let all = exported.all_labels();
    for label in &uses.grouping {
        if !all.contains(label) {
            problems.push(format!(
                "{what}: groups or matches by {label:?}, a label no berth metric carries"
            ));
        }
    }
    problems
}

fn rules() -> Value {
    serde_yaml_ng::from_str(&read("monitoring/prometheus-rule.yaml"))
        .expect("monitoring/prometheus-rule.yaml is YAML")
}

fn alerts(rules: &Value) -> Vec<&Value> {
    rules["spec"]["groups"]
        .as_array()
        .expect("spec.groups is a list")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("each group has rules"))
        .collect()
}

/// The headings of a Markdown file as GitHub anchors them.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut seen = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#').trim().to_lowercase();
        let slug: String = text
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        seen.insert(slug);
    }
    seen
}

#[test]
fn alert_queries_use_only_what_berth_exports() {
    let exported = Exported::from_berth();
    let rules = rules();
    let mut problems = Vec::new();
    for alert in alerts(&rules) {
        let name = alert["alert"].as_str().unwrap_or("<no name>");
        let expr = alert["expr"]
            .as_str()
            .unwrap_or_else(|| panic!("alert {name} has no expr"));
        problems.extend(check_query(&format!("alert {name}"), expr, &exported));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_alert_has_severity_summary_description_and_a_runbook_in_the_guide() {
    let rules = rules();
    assert_eq!(rules["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rules["kind"], "PrometheusRule");
    assert!(rules["metadata"]["name"].is_string(), "metadata.name");
    let guide = "docs/operator-guide.md";
    let headings = anchors(&read(guide));

    let mut groups = BTreeSet::new();
    for group in rules["spec"]["groups"].as_array().unwrap() {
        let name = group["name"].as_str().expect("every group has a name");
        assert!(groups.insert(name), "group {name} twice");
    }
    let mut names = BTreeSet::new();
    let alerts = alerts(&rules);
    assert!(!alerts.is_empty(), "no alerts");
    let mut problems = Vec::new();
    for alert in alerts {
        let Some(name) = alert["alert"].as_str() else {
            problems.push(format!("a rule without `alert`: {alert}"));
            continue;
        };
        if !names.insert(name) {
            problems.push(format!("{name}: two alerts of that name"));
        }
        if let Some(for_) = alert.get("for") {
            let text = for_.as_str().unwrap_or_default();
            if let Err(e) = parse_duration(text) {
                problems.push(format!("{name}: for: {for_} is not a duration: {e}"));
            }
        }
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        if !["critical", "warning", "info"].contains(&severity) {
            problems.push(format!(
                "{name}: severity {severity:?} is not critical, warning or info"
            ));
        }
        for key in ["summary", "description", "runbook_url"] {
            let text = alert["annotations"][key].as_str().unwrap_or_default();
            if text.trim().is_empty() {
                problems.push(format!("{name}: no annotation {key}"));
            }
        }
        let runbook = alert["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        match runbook.split_once('#') {
            Some((file, anchor)) if file == guide => {
                if !headings.contains(anchor) {
                    problems.push(format!(
                        "{name}: runbook {runbook} names no heading of {guide}"
                    ));
                }
                if anchor != name.to_lowercase() {
                    problems.push(format!(
                        "{name}: runbook anchor {anchor:?} should be the alert's own section, {:?}",
                        name.to_lowercase()
                    ));
                }
            }
            _ => problems.push(format!(
                "{name}: runbook_url {runbook:?} does not point into {guide}#..."
            )),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Grafana's own variables, replaced as Grafana would before the query reaches
/// Prometheus. Label values (`$namespace`) sit inside strings and parse as they are.
fn substitute_grafana_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "6h")
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested);
        }
        all.push(panel);
    }
    all
}

#[test]
fn dashboard_queries_use_only_what_berth_exports_and_show_all_of_it() {
    let exported = Exported::from_berth();
    let path = Path::new("monitoring/grafana-dashboard.json");
    let dashboard: Value =
        serde_json::from_str(&read(path.to_str().unwrap())).expect("the dashboard is JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());

    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    let mut shown = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        if title.is_empty() {
            problems.push(format!("a panel without a title: id {}", panel["id"]));
        }
        if !ids.insert(panel["id"].as_i64().expect("every panel has an id")) {
            problems.push(format!("panel {title:?}: id {} twice", panel["id"]));
        }
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if targets.is_empty() {
            problems.push(format!("panel {title:?} has no query"));
        }
        for (i, target) in targets.iter().enumerate() {
            let Some(expr) = target["expr"].as_str() else {
                problems.push(format!("panel {title:?}: target {i} has no expr"));
                continue;
            };
            let expr = substitute_grafana_variables(expr);
            let what = format!("panel {title:?} target {i}");
            problems.extend(check_query(&what, &expr, &exported));
            if let Ok(parsed) = parser::parse(&expr) {
                let mut uses = Uses::default();
                walk_expr(&mut uses, &parsed).unwrap();
                shown.extend(uses.selectors.into_iter().map(|(name, _)| name));
            }
        }
    }

    // Template variables that list label values read a berth metric too.
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .unwrap_or_default();
        if let Some(args) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
        {
            let metric = args.split(',').next().unwrap().trim();
            if !exported.series.contains_key(metric) {
                problems.push(format!(
                    "variable {}: berth exports no metric {metric}",
                    variable["name"]
                ));
            }
        }
    }

    // Each family shows when one of its series is on a panel.
    for family in &exported.families {
        let on_a_panel = shown.iter().any(|s| {
            s.strip_prefix(family.as_str())
                .is_some_and(|rest| ["", "_total", "_bucket", "_sum", "_count"].contains(&rest))
        });
        if !on_a_panel {
            problems.push(format!(
                "berth exports {family}, but no dashboard panel shows it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checks themselves catch what they are for: a misspelt metric, an unknown
/// label, a query that does not parse.
#[test]
fn the_query_check_finds_unknown_metrics_labels_and_syntax_errors() {
    let exported = Exported::from_berth();
    let problems = |expr: &str| check_query("test", expr, &exported);
    assert!(problems("sum by (kind) (rate(berth_errors_total[5m]))").is_empty());
    assert!(problems("berth_errors")[0].contains("no metric berth_errors"));
    assert!(problems(r#"berth_errors_total{knd="busy"}"#)[0].contains("no label \"knd\""));
    assert!(problems("sum by (gates) (berth_gated_pods)")[0].contains("\"gates\""));
    assert!(problems("rate(berth_errors_total[5m]")[0].contains("does not parse"));
    assert!(problems(r#"{__name__="berth_leader"}"#).is_empty());
    let regex = problems(r#"{__name__=~"berth_.*"}"#);
    assert!(
        regex.iter().any(|p| p.contains("no metric name")),
        "{regex:?}"
    );
}
