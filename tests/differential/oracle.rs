//! The oracle process (tests/cluster/oracle): Kubernetes' own scheduling,
//! validation and admission-policy code, built from the control plane's Go modules
//! into the cache, asked one JSON line at a time.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::Deserialize;
use serde_json::{Value, json};

/// What Kubernetes' code says of one pod (see the oracle's `podAnswer`).
#[derive(Debug, Clone, Deserialize)]
pub struct PodAnswer {
    pub valid: bool,
    pub errors: Vec<String>,
    pub stored: Option<Value>,
    pub fits: Vec<bool>,
    pub why: Vec<String>,
    pub scores: Option<Vec<i64>>,
    /// The QoS class the pod registry records in the pod's status at create
    /// (`Guaranteed`, `Burstable`, `BestEffort`); empty when it cannot be decoded.
    pub qos: String,
}

impl PodAnswer {
    /// The nodes (by index) where the pod may run once the apiserver has it: none
    /// when the apiserver refuses it.
    pub fn placeable(&self) -> Vec<bool> {
        self.fits.iter().map(|f| *f && self.valid).collect()
    }
}

/// One case of Kubernetes' own table TestPodMatchesNodeSelectorAndAffinityTerms.
#[derive(Debug, Clone, Deserialize)]
pub struct Seed {
    pub name: String,
    pub pod: Value,
    pub node: Value,
    pub want: bool,
}

/// What the apiserver's admission-policy code says of one request.
#[derive(Debug, Clone, Deserialize)]
pub struct PolicyAnswer {
    pub denied: bool,
    pub messages: Vec<String>,
    pub nanos: i64,
    pub error: Option<String>,
}

/// What the apiserver's mutating-policy code makes of one request (see the
/// oracle's `mapAnswer`, tests/cluster/oracle/map.go).
#[derive(Debug, Clone, Deserialize)]
pub struct MapAnswer {
    /// matchConstraints and matchConditions select the request.
    pub matched: bool,
    /// The pod after the policy's mutations (v1, defaults applied); `None` when
    /// the policy did not match or the request is rejected.
    pub object: Option<Value>,
    /// The apiserver refuses the request: an error under failurePolicy Fail, or
    /// an internal one.
    pub rejected: bool,
    /// The policy ran a second time on its own output (reinvocationPolicy
    /// IfNeeded); its errors then start with "reinvocation: ".
    pub reinvoked: bool,
    /// The rejection's message, or else the first error met (which failurePolicy
    /// Ignore skips over).
    pub error: Option<String>,
    /// Every error a mutation or match condition met, in order.
    pub errors: Vec<String>,
    pub nanos: i64,
    /// The CEL cost the policy's expressions used, variables included.
    pub cost: i64,
}

pub struct Oracle {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Oracle {
    /// Builds the oracle (once, into the cache) and starts it. Fails, never
    /// skips, when it cannot be built.
    pub fn start() -> Oracle {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let built = Command::new(root.join("tests/cluster/build-oracle"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run tests/cluster/build-oracle");
        assert!(
            built.status.success(),
            "building the oracle failed; it needs Go (see tests/cluster/build-oracle)"
        );
        let binary = String::from_utf8(built.stdout).expect("a path");
        let mut child = Command::new(binary.trim())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the oracle");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Oracle {
            child,
            stdin,
            stdout,
        }
    }

    /// The oracle's answer, an error answer included.
    fn answer(&mut self, request: &Value) -> Value {
        let mut line = serde_json::to_vec(request).expect("a request");
        line.push(b'\n');
        self.stdin.write_all(&line).expect("write to the oracle");
        self.stdin.flush().expect("flush to the oracle");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("read from the oracle");
        serde_json::from_str(&answer).expect("the oracle answers JSON")
    }

    fn ask(&mut self, request: &Value) -> Value {
        let answer = self.answer(request);
        if let Some(error) = answer.get("error").and_then(Value::as_str) {
            panic!("the oracle refused the request: {error}");
        }
        answer
    }

    /// Each pod judged by the apiserver's validation and kube-scheduler's filters
    /// and scoring against `nodes`: one answer per pod, in order (the callers pair
    /// them with `zip`, which would stop short silently).
    pub fn evaluate(&mut self, pods: &[Value], nodes: &[Value]) -> Vec<PodAnswer> {
        let answer = self.ask(&json!({"op": "evaluate", "pods": pods, "nodes": nodes}));
        let answers: Vec<PodAnswer> =
            serde_json::from_value(answer["pods"].clone()).expect("pod answers");
        assert_eq!(answers.len(), pods.len(), "one answer per pod");
        answers
    }

    pub fn seeds(&mut self) -> Vec<Seed> {
        let answer = self.ask(&json!({"op": "seeds"}));
        serde_json::from_value(answer["seeds"].clone()).expect("seeds")
    }

    /// The ValidatingAdmissionPolicy `policy` run on each case: one answer per
    /// case, in order.
    pub fn admission_policy(&mut self, policy: &Value, cases: &[Value]) -> Vec<PolicyAnswer> {
        let answer = self.ask(&json!({"op": "vap", "policy": policy, "cases": cases}));
        let answers: Vec<PolicyAnswer> =
            serde_json::from_value(answer["results"].clone()).expect("policy answers");
        assert_eq!(answers.len(), cases.len(), "one answer per case");
        answers
    }

    /// The MutatingAdmissionPolicy `policy` (validated as the apiserver would a
    /// CREATE of it) dispatched by the apiserver's own code on each case (the
    /// fields of a `vap` case; `params` the paramKind object): one answer per
    /// case, in order.
    pub fn mutating_policy(&mut self, policy: &Value, cases: &[Value]) -> Vec<MapAnswer> {
        let answer = self.ask(&json!({"op": "map", "policy": policy, "cases": cases}));
        let answers: Vec<MapAnswer> =
            serde_json::from_value(answer["results"].clone()).expect("mutating policy answers");
        assert_eq!(answers.len(), cases.len(), "one answer per case");
        answers
    }

    /// `expression` evaluated by cel-go in the environment admission policies run
    /// in, each of `variables` (a JSON object) declared dyn and bound to its
    /// value: the result as JSON, or the compilation or evaluation error.
    pub fn cel(&mut self, expression: &str, variables: &Value) -> Result<Value, String> {
        let answer = self.answer(&json!({
            "op": "cel", "expression": expression, "variables": variables,
        }));
        cel_result(&answer)
    }

    /// Each of `expressions` evaluated as by [`Oracle::cel`], with the same
    /// variables: one result per expression, in order.
    pub fn cel_many(
        &mut self,
        expressions: &[String],
        variables: &Value,
    ) -> Vec<Result<Value, String>> {
        let answer = self.ask(&json!({
            "op": "cel", "expressions": expressions, "variables": variables,
        }));
        let values = answer["values"]
            .as_array()
            .expect("one value per expression");
        assert_eq!(values.len(), expressions.len(), "one value per expression");
        values.iter().map(cel_result).collect()
    }
}

fn cel_result(answer: &Value) -> Result<Value, String> {
    match answer.get("error") {
        Some(error) => Err(error.as_str().unwrap_or_default().to_string()),
        None => Ok(answer.get("value").cloned().expect("a value or an error")),
    }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
