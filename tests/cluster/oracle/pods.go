package main

import (
	"encoding/json"
	"fmt"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install" // core/v1 defaults and conversions in legacyscheme
	podregistry "k8s.io/kubernetes/pkg/registry/core/pod"
)

// podAnswer is what Kubernetes' code says of one pod.
type podAnswer struct {
	// Valid: the apiserver would accept this pod at CREATE (after defaulting).
	Valid  bool     `json:"valid"`
	Errors []string `json:"errors"`
	// Stored: the pod as the apiserver stores and serves it (defaults and the pod
	// registry's create steps applied, its status the registry's first; empty
	// lists and unknown fields dropped); null when it cannot be decoded.
	Stored json.RawMessage `json:"stored"`
	// Fits: per node, whether the pod may run there (whatever Valid says).
	Fits []bool `json:"fits"`
	// Why: per node, the first reason it may not run there ("" when it fits).
	Why []string `json:"why"`
	// Scores: per node, kube-scheduler's node-affinity score (the sum of the
	// weights of the preferred terms that match); null when a preferred term does
	// not parse (kube-scheduler then fails the pod's scoring).
	Scores []int64 `json:"scores"`
	// QOS: the pod's QoS class as the pod registry records it in status.qosClass
	// at create (with the feature gates of this version); "" when it cannot be
	// decoded.
	QOS string `json:"qos"`
}

type evaluateAnswer struct {
	Pods  []podAnswer `json:"pods"`
	Error string      `json:"error,omitempty"`
}

func evaluate(rawPods, rawNodes []json.RawMessage) evaluateAnswer {
	nodes := make([]*v1.Node, len(rawNodes))
	for i, raw := range rawNodes {
		nodes[i] = &v1.Node{}
		if err := json.Unmarshal(raw, nodes[i]); err != nil {
			return evaluateAnswer{Error: fmt.Sprintf("node %d: %v", i, err)}
		}
	}
	answers := make([]podAnswer, len(rawPods))
	for i, raw := range rawPods {
		answers[i] = evaluatePod(raw, nodes)
	}
	return evaluateAnswer{Pods: answers}
}

// evaluatePod decodes the pod as the apiserver decodes a request body (into the
// internal type, with the v1 defaults), prepares and validates it as the pod
// registry does at CREATE, after admission, encodes it back as v1 (what is stored
// and served: what the controller reads, and what a webhook sees of the pod when
// it is next updated or re-created from it), and judges that pod against each
// node.
func evaluatePod(raw json.RawMessage, nodes []*v1.Node) podAnswer {
	answer := podAnswer{Errors: []string{}}
	decoded, _, err := legacyscheme.Codecs.UniversalDecoder(api.SchemeGroupVersion).Decode(raw, nil, nil)
	pod := &v1.Pod{}
	if err != nil {
		answer.Errors = append(answer.Errors, "decode: "+err.Error())
		// Judge the pod as written, so that fits can still be compared.
		if err := json.Unmarshal(raw, pod); err != nil {
			answer.Fits = make([]bool, len(nodes))
			answer.Why = make([]string, len(nodes))
			return answer
		}
	} else {
		internal, ok := decoded.(*api.Pod)
		if !ok {
			answer.Errors = append(answer.Errors, fmt.Sprintf("decode: not a Pod but %T", decoded))
			answer.Fits = make([]bool, len(nodes))
			answer.Why = make([]string, len(nodes))
			return answer
		}
		// The pod registry's own create steps, after admission: PrepareForCreate
		// (generation 1 and a fresh status, fields of disabled features dropped,
		// the SchedulingGated condition, matchLabelKeys merged into pod-affinity
		// selectors and topology spread, the AppArmor version skew, pod-level
		// requests and limits filled from the containers', the QoS class
		// recorded), then its validation (ValidatePodCreate; the declarative
		// validation rest.ValidateCreate adds is not run).
		ctx := genericapirequest.NewDefaultContext()
		podregistry.Strategy.PrepareForCreate(ctx, internal)
		for _, e := range podregistry.Strategy.Validate(ctx, internal) {
			answer.Errors = append(answer.Errors, e.Error())
		}
		answer.Valid = len(answer.Errors) == 0
		answer.QOS = string(internal.Status.QOSClass)
		stored, err := runtime.Encode(legacyscheme.Codecs.LegacyCodec(v1.SchemeGroupVersion), internal)
		if err != nil {
			answer.Errors = append(answer.Errors, "encode: "+err.Error())
			answer.Valid = false
		} else {
			answer.Stored = stored
			if err := json.Unmarshal(stored, pod); err != nil {
				answer.Errors = append(answer.Errors, "re-read: "+err.Error())
				answer.Valid = false
			}
		}
	}
	answer.Fits = make([]bool, len(nodes))
	answer.Why = make([]string, len(nodes))
	for i, node := range nodes {
		answer.Why[i] = whyNot(pod, node)
		answer.Fits[i] = answer.Why[i] == ""
	}
	answer.Scores = scores(pod, nodes)
	return answer
}

// whyNot is "" when the pod may run on the node, else the first reason it may not.
//
// A pod without spec.nodeName is placed by kube-scheduler, whose NodeAffinity
// filter applies nodeSelector and required node affinity, and whose
// TaintToleration filter refuses untolerated NoSchedule and NoExecute taints. A
// pod that names its node skips the scheduler: the kubelet admits it checking
// node name and node affinity, but of the taints only NoExecute
// (pkg/kubelet/lifecycle/predicate.go, generalFilter).
func whyNot(pod *v1.Pod, node *v1.Node) string {
	named := pod.Spec.NodeName != ""
	if named && pod.Spec.NodeName != node.Name {
		return "the pod names another node"
	}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); !ok {
		if err != nil {
			return "node affinity does not parse: " + err.Error()
		}
		return "node affinity does not match"
	}
	counted := func(t *v1.Taint) bool {
		return t.Effect == v1.TaintEffectNoExecute || (!named && t.Effect == v1.TaintEffectNoSchedule)
	}
	// A value a comparison cannot read is logged there; the answer says it here.
	if taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), node.Spec.Taints, pod.Spec.Tolerations, counted, true); untolerated {
		return "untolerated taint " + taint.ToString()
	}
	return ""
}

func scores(pod *v1.Pod, nodes []*v1.Node) []int64 {
	out := make([]int64, len(nodes))
	affinity := pod.Spec.Affinity
	if affinity == nil || affinity.NodeAffinity == nil {
		return out
	}
	terms, err := nodeaffinity.NewPreferredSchedulingTerms(affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
	if err != nil {
		return nil
	}
	for i, node := range nodes {
		out[i] = terms.Score(node)
	}
	return out
}
