package main

import (
	"context"
	"encoding/json"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"
)

// vapCase is one admission request for a ValidatingAdmissionPolicy.
type vapCase struct {
	// Operation is CREATE or UPDATE.
	Operation string `json:"operation"`
	// Resource is "pods" or "bindings" (a pod's binding subresource).
	Resource  string          `json:"resource"`
	Object    json.RawMessage `json:"object"`
	OldObject json.RawMessage `json:"oldObject,omitempty"`
	Namespace json.RawMessage `json:"namespace"`
	// Params is the PlacementPolicy the binding's paramRef selects, if any.
	Params   json.RawMessage `json:"params,omitempty"`
	Username string          `json:"username"`
	Groups   []string        `json:"groups,omitempty"`
}

type vapAnswer struct {
	// Matched: the policy's namespaceSelector and matchConditions select the request.
	Matched  bool     `json:"matched"`
	Denied   bool     `json:"denied"`
	Messages []string `json:"messages"`
	// Nanos is the time CEL took on this request.
	Nanos int64  `json:"nanos"`
	Error string `json:"error,omitempty"`
}

type vapResult struct {
	Results []vapAnswer `json:"results"`
	Error   string      `json:"error,omitempty"`
}

// runPolicy compiles the policy as the apiserver's ValidatingAdmissionPolicy
// plugin does (validating.compilePolicy, rebuilt from its exported parts) and
// runs it on each case, with the objects converted to v1 as the apiserver hands
// them to CEL. Resource rules are the caller's business; the namespaceSelector
// is applied here.
func runPolicy(rawPolicy json.RawMessage, cases []vapCase) vapResult {
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := json.Unmarshal(rawPolicy, policy); err != nil {
		return vapResult{Error: "policy: " + err.Error()}
	}
	validator, err := compile(policy)
	if err != nil {
		return vapResult{Error: "policy: " + err.Error()}
	}
	var selector labels.Selector = labels.Everything()
	if c := policy.Spec.MatchConstraints; c != nil && c.NamespaceSelector != nil {
		if selector, err = metav1.LabelSelectorAsSelector(c.NamespaceSelector); err != nil {
			return vapResult{Error: "namespaceSelector: " + err.Error()}
		}
	}
	results := make([]vapAnswer, len(cases))
	for i := range cases {
		results[i] = runCase(validator, selector, &cases[i])
	}
	return vapResult{Results: results}
}

func compile(policy *admissionregistrationv1.ValidatingAdmissionPolicy) (validating.Validator, error) {
	hasParams := policy.Spec.ParamKind != nil
	// berth's policies do not use `authorizer`; without it no authorizer is needed.
	vars := plugincel.OptionalVariableDeclarations{HasParams: hasParams}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, err
	}
	variables := make([]plugincel.NamedExpressionAccessor, len(policy.Spec.Variables))
	for i, v := range policy.Spec.Variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(variables, vars, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if conditions := policy.Spec.MatchConditions; len(conditions) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(conditions))
		for i := range conditions {
			accessors[i] = (*matchconditions.MatchCondition)(&conditions[i])
		}
		matcher = matchconditions.NewMatcher(compiler.CompileCondition(accessors, vars, environment.StoredExpressions),
			policy.Spec.FailurePolicy, "policy", "validate", policy.Name)
	}
	validations := make([]plugincel.ExpressionAccessor, len(policy.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(policy.Spec.Validations))
	for i, v := range policy.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	validator := validating.NewValidator(
		compiler.CompileCondition(validations, vars, environment.StoredExpressions),
		matcher,
		compiler.CompileCondition(nil, vars, environment.StoredExpressions),
		compiler.CompileCondition(messages, plugincel.OptionalVariableDeclarations{HasParams: hasParams}, environment.StoredExpressions),
		policy.Spec.FailurePolicy,
		nil,
	)
	return validator, nil
}

func runCase(validator validating.Validator, selector labels.Selector, c *vapCase) vapAnswer {
	answer := vapAnswer{Messages: []string{}}
	namespace := &v1.Namespace{}
	if err := json.Unmarshal(c.Namespace, namespace); err != nil {
		answer.Error = "namespace: " + err.Error()
		return answer
	}
	if !selector.Matches(labels.Set(namespace.Labels)) {
		return answer
	}
	var object, oldObject runtime.Object
	var kind schema.GroupVersionKind
	var err error
	switch c.Resource {
	case "pods":
		kind = v1.SchemeGroupVersion.WithKind("Pod")
		if object, err = versionedPod(c.Object); err != nil {
			answer.Error = "object: " + err.Error()
			return answer
		}
		if len(c.OldObject) > 0 {
			if oldObject, err = versionedPod(c.OldObject); err != nil {
				answer.Error = "oldObject: " + err.Error()
				return answer
			}
		}
	case "bindings":
		kind = v1.SchemeGroupVersion.WithKind("Binding")
		binding := &v1.Binding{}
		if err := json.Unmarshal(c.Object, binding); err != nil {
			answer.Error = "object: " + err.Error()
			return answer
		}
		object = binding
	default:
		answer.Error = "unknown resource " + c.Resource
		return answer
	}
	var params runtime.Object
	if len(c.Params) > 0 {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(c.Params); err != nil {
			answer.Error = "params: " + err.Error()
			return answer
		}
		params = u
	}
	resource := v1.SchemeGroupVersion.WithResource("pods")
	subresource := ""
	if c.Resource == "bindings" {
		subresource = "binding"
	}
	name := ""
	if accessor, ok := object.(metav1.Object); ok {
		name = accessor.GetName()
	}
	attributes := admission.NewAttributesRecord(object, oldObject, kind, namespace.Name, name, resource,
		subresource, admission.Operation(c.Operation), nil, false,
		&user.DefaultInfo{Name: c.Username, Groups: c.Groups})
	versioned := &admission.VersionedAttributes{
		Attributes:         attributes,
		VersionedKind:      kind,
		VersionedObject:    admission.NewLazyObject(object),
		VersionedOldObject: admission.NewLazyObject(oldObject),
	}
	start := time.Now()
	result := validator.Validate(context.Background(), resource, versioned, params, namespace, celconfig.RuntimeCELCostBudget, nil)
	answer.Nanos = time.Since(start).Nanoseconds()
	answer.Matched = result.Decisions != nil
	for _, d := range result.Decisions {
		if d.Evaluation == validating.EvalError {
			answer.Error = d.Message
		}
		if d.Action == validating.ActionDeny {
			answer.Denied = true
			answer.Messages = append(answer.Messages, d.Message)
		}
	}
	return answer
}

// versionedPod is the pod as the apiserver hands it to admission: decoded with
// the v1 defaults into the internal type, and converted back to v1.
func versionedPod(raw json.RawMessage) (*v1.Pod, error) {
	decoded, _, err := legacyscheme.Codecs.UniversalDecoder(api.SchemeGroupVersion).Decode(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	pod := &v1.Pod{}
	if err := legacyscheme.Scheme.Convert(decoded, pod, nil); err != nil {
		return nil, err
	}
	pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	return pod, nil
}
