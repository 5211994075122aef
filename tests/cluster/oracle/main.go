// Command oracle answers questions about pods, nodes and admission policies with
// Kubernetes' own code, so that berth's tests can check berth against code berth
// did not write. It reads one JSON request per line on stdin and writes one JSON
// answer per line on stdout:
//
//   - {"op":"evaluate","pods":[...],"nodes":[...]}: for each pod, whether the
//     apiserver accepts it (defaulting and validation, as a pod CREATE), the pod
//     as the apiserver stores and serves it, and for each node whether the pod
//     may run there (kube-scheduler's node affinity and taint filters, or the
//     kubelet's admission for a pod that names its node) and its node-affinity
//     score;
//   - {"op":"seeds"}: the cases of Kubernetes' own table
//     TestPodMatchesNodeSelectorAndAffinityTerms, read from the module cache when
//     the oracle was built;
//   - {"op":"vap","policy":{...},"cases":[...]}: a ValidatingAdmissionPolicy
//     compiled and run by the apiserver's own admission code on each case;
//   - {"op":"map","policy":{...},"cases":[...]}: a MutatingAdmissionPolicy
//     validated, compiled and dispatched by the apiserver's own admission code on
//     each case: whether it matched, the pod after its mutations, its errors and
//     whether they reject the request (map.go);
//   - {"op":"cel","expression":"...","variables":{...}} (or "expressions":[...]):
//     CEL expressions evaluated in the environment admission policies run in,
//     each variable dyn and bound to its JSON value: {"value":...} or
//     {"error":"..."} (or {"values":[...]}, one of those per expression; cel.go).
//
// The Kubernetes version is the control plane's (go.mod), so the oracle is the
// cluster berth's end-to-end tests run against. Taint toleration comparison
// operators (Gt, Lt; alpha since 1.35) are on, so their semantics are checked.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/features"
)

type request struct {
	Op     string            `json:"op"`
	Pods   []json.RawMessage `json:"pods,omitempty"`
	Nodes  []json.RawMessage `json:"nodes,omitempty"`
	Policy json.RawMessage   `json:"policy,omitempty"`
	Cases  []vapCase         `json:"cases,omitempty"`
	// The cel op's expression (or expressions) and variables.
	Expression  *string                    `json:"expression,omitempty"`
	Expressions []string                   `json:"expressions,omitempty"`
	Variables   map[string]json.RawMessage `json:"variables,omitempty"`
}

func main() {
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{
		string(features.TaintTolerationComparisonOperators): true,
	}); err != nil {
		fmt.Fprintf(os.Stderr, "oracle: %v\n", err)
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 256<<20)
	out := bufio.NewWriter(os.Stdout)
	encoder := json.NewEncoder(out)
	for in.Scan() {
		var req request
		var answer any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			answer = map[string]string{"error": fmt.Sprintf("cannot read the request: %v", err)}
		} else {
			answer = handle(&req)
		}
		if err := encoder.Encode(answer); err != nil {
			fmt.Fprintf(os.Stderr, "oracle: %v\n", err)
			os.Exit(1)
		}
		if err := out.Flush(); err != nil {
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "oracle: %v\n", err)
		os.Exit(1)
	}
}

func handle(req *request) any {
	switch req.Op {
	case "evaluate":
		return evaluate(req.Pods, req.Nodes)
	case "seeds":
		return map[string]any{"seeds": seeds()}
	case "vap":
		return runPolicy(req.Policy, req.Cases)
	case "map":
		return runMutatingPolicy(req.Policy, req.Cases)
	case "cel":
		return celRequest(req)
	default:
		return map[string]string{"error": fmt.Sprintf("unknown op %q", req.Op)}
	}
}
