package main

import (
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// seed is one case of Kubernetes' own table: a pod, a node, and whether the pod's
// nodeSelector and required node affinity match the node.
type seed struct {
	Name string   `json:"name"`
	Pod  *v1.Pod  `json:"pod"`
	Node *v1.Node `json:"node"`
	Want bool     `json:"want"`
}

// seeds are the cases of TestPodMatchesNodeSelectorAndAffinityTerms in
// k8s.io/component-helpers, which the build extracts from the module cache into
// podMatchesTable (seedgen); nothing of it is kept in berth's repository. Each
// case is checked here against the code it tests, so that an extraction gone
// wrong stops the oracle instead of seeding wrong answers.
func seeds() []seed {
	out := make([]seed, 0, len(podMatchesTable))
	for _, c := range podMatchesTable {
		pod := c.pod.DeepCopy()
		pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		node := &v1.Node{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{Name: c.nodeName, Labels: c.labels},
		}
		if got, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); got != c.want {
			fmt.Fprintf(os.Stderr, "oracle: seed %q: the table says %v, the code %v\n", c.name, c.want, got)
			os.Exit(1)
		}
		out = append(out, seed{Name: c.name, Pod: pod, Node: node, Want: c.want})
	}
	return out
}
