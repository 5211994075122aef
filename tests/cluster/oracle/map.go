package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/matching"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/applyconfigurations"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/admissionregistration"
	_ "k8s.io/kubernetes/pkg/apis/admissionregistration/install"
	admissionvalidation "k8s.io/kubernetes/pkg/apis/admissionregistration/validation"
	api "k8s.io/kubernetes/pkg/apis/core"
)

// A MutatingAdmissionPolicy run the way the apiserver runs it: the policy is
// decoded with the API's defaults and validated as a CREATE of the policy would
// be; it is compiled as the plugin's (unexported) compilePolicy compiles it; and
// each case is dispatched by the plugin's own dispatcher (mutating.NewDispatcher),
// which does the matching (matchConstraints, then matchConditions), runs the
// mutations and turns their errors into the request's fate. What is mirrored of
// k8s.io/apiserver v0.37.2 (pkg/admission/plugin/policy/mutating/dispatcher.go,
// ../generic/policy_dispatcher.go, pkg/admission/reinvocation.go):
//
//   - The mutations of one policy run in order, each on the object the previous
//     one left (dispatchOne: patch, convert the result back to the typed v1 Pod,
//     apply the v1 defaults, UpdateObject). A mutation that fails with a plain
//     error is skipped and the next one runs on the object as it was; the errors
//     are gathered and, after all mutations, dropped when failurePolicy is Ignore
//     (the object keeps the mutations that succeeded) or turned into a rejection
//     of the request when it is Fail (no object). A mutation failing with a
//     StatusError (the patched JSON does not decode as a Pod: an internal error)
//     rejects the request at once, whatever the failurePolicy.
//   - matchConditions are evaluated by matchconditions.Matcher with the policy's
//     failurePolicy: an error under Ignore is "no match" (the error is reported
//     here all the same), under Fail a rejection. They see no namespaceObject,
//     and on the second pass (below) they are evaluated again even for a policy
//     whose mutations will not run again.
//   - Reinvocation: the admission chain runs the mutating plugins a second time
//     when one of them asked for it (reinvoker.Admit). This dispatcher asks
//     whenever a mutation succeeded, and then, for a policy with
//     reinvocationPolicy IfNeeded, lists the policy itself among those to run
//     again: so an IfNeeded policy that mutated is run a second time on its own
//     output (matchConstraints and matchConditions evaluated afresh), even when no
//     other plugin changed the object. Here the chain is this one policy, so the
//     second pass is exactly reinvoker.Admit's second call; the other admission
//     plugins of a real apiserver (defaulting plugins, webhooks) are not run.
//
// Not mirrored: bindings (one binding is made up, with no matchResources, naming
// the case's params), the authorizer (`authorizer` in CEL says "no" to
// everything), and type checking against schemas. On type checking: this
// version of Kubernetes type-checks only ValidatingAdmissionPolicies against the
// schemas of the kinds they match and of a paramKind that has one, and only into
// warnings on the policy's status (pkg/controller/validatingadmissionpolicystatus);
// nothing type-checks a MutatingAdmissionPolicy against a schema, and at runtime
// `object` and `params` are dynamic either way. The params here are unstructured,
// so dynamically typed, as the apiserver's are. ApplyConfiguration
// merges use the structured-merge-diff schema of the v1 types that client-go
// carries for this version (the apiserver reads the same schema from its
// OpenAPI v3 discovery).

// mapCase is one admission request for a MutatingAdmissionPolicy: the fields of
// vapCase, with Params the paramKind object (unstructured), if any.
type mapCase = vapCase

type mapAnswer struct {
	// Matched: matchConstraints (rules, namespaceSelector, objectSelector) and
	// matchConditions select the request, on the first pass.
	Matched bool `json:"matched"`
	// Object is the pod after the policy (v1, as the apiserver then holds it); null
	// when the policy did not match or the request was rejected.
	Object json.RawMessage `json:"object"`
	// Rejected: the apiserver refuses the request (an error under failurePolicy
	// Fail, or an internal error).
	Rejected bool `json:"rejected"`
	// Reinvoked: the policy's mutations ran a second time, on their own output
	// (reinvocationPolicy IfNeeded); errors then are marked "reinvocation: ".
	Reinvoked bool `json:"reinvoked"`
	// Error is the rejection's message, or else the first error a mutation or a
	// match condition met (ignored under failurePolicy Ignore); Errors all of them,
	// in order.
	Error  string   `json:"error,omitempty"`
	Errors []string `json:"errors"`
	// Nanos is the time the plugin took (CEL, patching, conversion, defaulting).
	Nanos int64 `json:"nanos"`
	// Cost is the CEL cost the mutations and matchConditions used (variables
	// included), summed over both passes.
	Cost int64 `json:"cost"`
}

type mapResult struct {
	Results []mapAnswer `json:"results"`
	Error   string      `json:"error,omitempty"`
}

// observer gathers what the plugin does not report: the errors that failurePolicy
// Ignore swallows, the matchConditions' verdicts and the CEL cost.
type observer struct {
	errors  []string
	matches []bool
	cost    int64
	// mutations counts the mutations run; prefix is put before the errors (the
	// second pass's are marked).
	mutations int
	prefix    string
}

func (o *observer) error(message string) {
	o.errors = append(o.errors, o.prefix+message)
}

func runMutatingPolicy(rawPolicy json.RawMessage, cases []mapCase) mapResult {
	policy, err := decodeMutatingPolicy(rawPolicy)
	if err != nil {
		return mapResult{Error: "policy: " + err.Error()}
	}
	seen := &observer{}
	evaluator := compileMutatingPolicy(policy, seen)
	if evaluator.Error != nil {
		return mapResult{Error: "policy: " + evaluator.Error.Error()}
	}
	results := make([]mapAnswer, len(cases))
	for i := range cases {
		*seen = observer{}
		results[i] = runMutatingCase(policy, evaluator, seen, &cases[i])
	}
	return mapResult{Results: results}
}

// decodeMutatingPolicy reads the policy as the apiserver does a CREATE of it:
// decoded with the v1 defaults (failurePolicy Fail, matchPolicy Equivalent, empty
// selectors) and validated, expressions compiled in the environment for new
// expressions included.
func decodeMutatingPolicy(raw json.RawMessage) (*admissionregistrationv1.MutatingAdmissionPolicy, error) {
	gvk := admissionregistrationv1.SchemeGroupVersion.WithKind("MutatingAdmissionPolicy")
	decoded, _, err := legacyscheme.Codecs.UniversalDecoder(admissionregistration.SchemeGroupVersion).Decode(raw, &gvk, nil)
	if err != nil {
		return nil, err
	}
	internal, ok := decoded.(*admissionregistration.MutatingAdmissionPolicy)
	if !ok {
		return nil, fmt.Errorf("not a MutatingAdmissionPolicy but %T", decoded)
	}
	if errs := admissionvalidation.ValidateMutatingAdmissionPolicy(internal); len(errs) > 0 {
		return nil, fmt.Errorf("the apiserver would refuse it: %v", errs.ToAggregate())
	}
	policy := &admissionregistrationv1.MutatingAdmissionPolicy{}
	if err := legacyscheme.Scheme.Convert(internal, policy, nil); err != nil {
		return nil, err
	}
	policy.TypeMeta = metav1.TypeMeta{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}
	return policy, nil
}

// compileMutatingPolicy is the plugin's compilePolicy (compilation.go), step for
// step, with each compiled expression wrapped so that its cost and errors are
// seen; the wrappers pass everything through unchanged.
func compileMutatingPolicy(policy *admissionregistrationv1.MutatingAdmissionPolicy, seen *observer) mutating.PolicyEvaluator {
	opts := plugincel.OptionalVariableDeclarations{HasParams: policy.Spec.ParamKind != nil, HasAuthorizer: true}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return mutating.PolicyEvaluator{Error: err}
	}
	variables := make([]plugincel.NamedExpressionAccessor, len(policy.Spec.Variables))
	for i, v := range policy.Spec.Variables {
		variables[i] = &mutating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(variables, opts, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if conditions := policy.Spec.MatchConditions; len(conditions) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(conditions))
		for i := range conditions {
			accessors[i] = (*matchconditions.MatchCondition)(&conditions[i])
		}
		filter := &costConditions{compiler.CompileCondition(accessors, opts, environment.StoredExpressions), seen}
		matcher = &seenMatcher{matchconditions.NewMatcher(filter, policy.Spec.FailurePolicy, "policy", "validate", policy.Name), seen}
	}
	var patchers []patch.Patcher
	patchOptions := opts
	patchOptions.HasPatchTypes = true
	for _, m := range policy.Spec.Mutations {
		switch m.PatchType {
		case admissionregistrationv1.PatchTypeJSONPatch:
			if m.JSONPatch != nil {
				accessor := &patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}
				compiled := compiler.CompileMutatingEvaluator(accessor, patchOptions, environment.StoredExpressions)
				patchers = append(patchers, &seenPatcher{patch.NewJSONPatcher(&costMutation{compiled, seen}), seen})
			}
		case admissionregistrationv1.PatchTypeApplyConfiguration:
			if m.ApplyConfiguration != nil {
				accessor := &patch.ApplyConfigurationCondition{Expression: m.ApplyConfiguration.Expression}
				compiled := compiler.CompileMutatingEvaluator(accessor, patchOptions, environment.StoredExpressions)
				patchers = append(patchers, &seenPatcher{patch.NewApplyConfigurationPatcher(&costMutation{compiled, seen}), seen})
			}
		}
	}
	return mutating.PolicyEvaluator{Matcher: matcher, Mutators: patchers, CompositedCompiler: compiler}
}

func runMutatingCase(policy *admissionregistrationv1.MutatingAdmissionPolicy, evaluator mutating.PolicyEvaluator, seen *observer, c *mapCase) mapAnswer {
	answer := mapAnswer{Errors: []string{}, Object: json.RawMessage("null")}
	namespace := &v1.Namespace{}
	if err := json.Unmarshal(c.Namespace, namespace); err != nil {
		answer.Error = "namespace: " + err.Error()
		return answer
	}
	if c.Resource != "pods" {
		answer.Error = "unknown resource " + c.Resource
		return answer
	}
	// The attributes hold the internal pod, decoded with the v1 defaults, as the
	// apiserver's admission chain does; the dispatcher converts it to v1.
	object, err := internalPod(c.Object)
	if err != nil {
		answer.Error = "object: " + err.Error()
		return answer
	}
	var oldObject runtime.Object
	if len(c.OldObject) > 0 {
		if oldObject, err = internalPod(c.OldObject); err != nil {
			answer.Error = "oldObject: " + err.Error()
			return answer
		}
	}
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: policy.Name},
	}
	hook := mutating.PolicyHook{Policy: policy, Bindings: []*mutating.PolicyBinding{binding}, Evaluator: evaluator}
	if len(c.Params) > 0 {
		params := &unstructured.Unstructured{}
		if err := params.UnmarshalJSON(c.Params); err != nil {
			answer.Error = "params: " + err.Error()
			return answer
		}
		deny := admissionregistrationv1.DenyAction
		binding.Spec.ParamRef = &admissionregistrationv1.ParamRef{Name: params.GetName(), ParameterNotFoundAction: &deny}
		hook.ParamInformer, hook.ParamScope = paramSource(params)
	}
	namespaces := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := namespaces.Add(namespace); err != nil {
		answer.Error = "namespace: " + err.Error()
		return answer
	}
	matcher := matching.NewMatcher(listersv1.NewNamespaceLister(namespaces), nil)
	converters := patch.NewTypeConverterManager(applyconfigurations.NewTypeConverter(legacyscheme.Scheme), nil)
	dispatcher := mutating.NewDispatcher(authorizerfactory.NewAlwaysDenyAuthorizer(), matcher, converters)
	interfaces := admission.NewObjectInterfacesFromScheme(legacyscheme.Scheme)
	attributes := admission.NewAttributesRecord(object, oldObject, v1.SchemeGroupVersion.WithKind("Pod"),
		namespace.Name, object.Name, v1.SchemeGroupVersion.WithResource("pods"), "",
		admission.Operation(c.Operation), nil, false, &user.DefaultInfo{Name: c.Username, Groups: c.Groups})

	matches, _, _, err := generic.NewPolicyMatcher(matcher).DefinitionMatches(attributes, interfaces, mutating.NewMutatingAdmissionPolicyAccessor(policy))
	if err != nil {
		seen.error(err.Error())
	}
	ctx := context.Background()
	start := time.Now()
	// reinvoker.Admit, with this policy for the whole chain.
	err = dispatcher.Dispatch(ctx, attributes, interfaces, []mutating.PolicyHook{hook})
	firstMatches, firstMutations := seen.matches, seen.mutations
	if reinvocation := attributes.GetReinvocationContext(); err == nil && reinvocation.ShouldReinvoke() {
		// The chain runs again; the dispatcher decides whether the policy's
		// mutations do (its matchConditions are evaluated again either way).
		reinvocation.SetIsReinvoke()
		seen.prefix = "reinvocation: "
		err = dispatcher.Dispatch(ctx, attributes, interfaces, []mutating.PolicyHook{hook})
		answer.Reinvoked = seen.mutations > firstMutations
	}
	answer.Nanos = time.Since(start).Nanoseconds()
	answer.Matched = matches && (len(firstMatches) == 0 || firstMatches[0])
	answer.Errors = append(answer.Errors, seen.errors...)
	answer.Cost = seen.cost
	if err != nil {
		answer.Rejected = true
		answer.Error = err.Error()
		return answer
	}
	if len(seen.errors) > 0 {
		answer.Error = seen.errors[0]
	}
	if answer.Matched {
		// The pod as the apiserver holds it after the plugin, encoded as v1.
		stored, err := runtime.Encode(legacyscheme.Codecs.LegacyCodec(v1.SchemeGroupVersion), attributes.GetObject())
		if err != nil {
			answer.Error = "encoding the result: " + err.Error()
			return answer
		}
		answer.Object = stored
	}
	return answer
}

// internalPod is the pod as the admission chain holds it: decoded with the v1
// defaults into the internal type (what versionedPod converts back to v1).
func internalPod(raw json.RawMessage) (*api.Pod, error) {
	decoded, _, err := legacyscheme.Codecs.UniversalDecoder(api.SchemeGroupVersion).Decode(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	pod, ok := decoded.(*api.Pod)
	if !ok {
		return nil, fmt.Errorf("not a Pod but %T", decoded)
	}
	return pod, nil
}

// paramSource is what the plugin's policy source hands the dispatcher for a
// paramKind: an informer (here one that has synced, over a store holding the
// case's params) and the params' scope.
func paramSource(params *unstructured.Unstructured) (paramInformer, meta.RESTScope) {
	store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	_ = store.Add(params)
	gvk := params.GroupVersionKind()
	resource := schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}
	scope := meta.RESTScopeRoot
	if params.GetNamespace() != "" {
		scope = meta.RESTScopeNamespace
	}
	return paramInformer{cache.NewGenericLister(store, resource)}, scope
}

type paramInformer struct{ lister cache.GenericLister }

func (p paramInformer) Informer() cache.SharedIndexInformer { return syncedInformer{} }
func (p paramInformer) Lister() cache.GenericLister         { return p.lister }

// syncedInformer is only asked whether it has synced (generic.CollectParams).
type syncedInformer struct{ cache.SharedIndexInformer }

func (syncedInformer) HasSynced() bool { return true }

// costMutation passes a mutation's evaluation through, adding up its cost.
type costMutation struct {
	plugincel.MutatingEvaluator
	seen *observer
}

func (e *costMutation) ForInput(ctx context.Context, attributes *admission.VersionedAttributes, request *admissionv1.AdmissionRequest, bindings plugincel.OptionalVariableBindings, namespace *v1.Namespace, budget int64) (plugincel.EvaluationResult, int64, error) {
	result, remaining, err := e.MutatingEvaluator.ForInput(ctx, attributes, request, bindings, namespace, budget)
	if remaining >= 0 {
		e.seen.cost += budget - remaining
	}
	return result, remaining, err
}

// costConditions passes the matchConditions' evaluation through, adding up
// their cost.
type costConditions struct {
	plugincel.ConditionEvaluator
	seen *observer
}

func (e *costConditions) ForInput(ctx context.Context, attributes *admission.VersionedAttributes, request *admissionv1.AdmissionRequest, bindings plugincel.OptionalVariableBindings, namespace *v1.Namespace, budget int64) ([]plugincel.EvaluationResult, int64, error) {
	results, remaining, err := e.ConditionEvaluator.ForInput(ctx, attributes, request, bindings, namespace, budget)
	if remaining >= 0 {
		e.seen.cost += budget - remaining
	}
	for _, r := range results {
		if r.Error != nil {
			e.seen.error("matchConditions: " + r.Error.Error())
		}
	}
	return results, remaining, err
}

// seenMatcher passes the matchConditions' verdict through, noting it.
type seenMatcher struct {
	matchconditions.Matcher
	seen *observer
}

func (m *seenMatcher) Match(ctx context.Context, attributes *admission.VersionedAttributes, params runtime.Object, authz authorizer.UnconditionalAuthorizer) matchconditions.MatchResult {
	result := m.Matcher.Match(ctx, attributes, params, authz)
	m.seen.matches = append(m.seen.matches, result.Matches)
	return result
}

// seenPatcher passes a mutation through, noting its error.
type seenPatcher struct {
	patch.Patcher
	seen *observer
}

func (p *seenPatcher) Patch(ctx context.Context, request patch.Request, budget int64) (runtime.Object, error) {
	p.seen.mutations++
	object, err := p.Patcher.Patch(ctx, request, budget)
	if err != nil {
		message := err.Error()
		var status *k8serrors.StatusError
		if errors.As(err, &status) {
			message = "internal: " + message
		}
		p.seen.error(message)
	}
	return object, err
}
