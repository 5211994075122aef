package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"

	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/version"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// celAnswer is the value of one expression, or why there is none.
type celAnswer struct {
	Value any    `json:"value"`
	Error string `json:"error,omitempty"`
	// Cost is the runtime cost the evaluation used.
	Cost uint64 `json:"cost"`
}

// evaluateCEL evaluates each expression with the given variables (each declared
// dyn and bound to its JSON value, numbers read as the apiserver reads JSON:
// int64 when integral, else float64) in the environment admission policies'
// expressions are stored and run in: the base environment at the default
// compatibility version (the libraries: strings, regex, lists, quantity, ...), as
// environment.StoredExpressions, compiled and run with the options of the
// admission plugins' compiler (plugin/cel/compile.go) and its per-call cost limit.
func evaluateCEL(expressions []string, rawVariables map[string]json.RawMessage) ([]celAnswer, error) {
	names := make([]string, 0, len(rawVariables))
	for name := range rawVariables {
		names = append(names, name)
	}
	sort.Strings(names)
	options := make([]cel.EnvOption, 0, len(names))
	bindings := make(map[string]any, len(names))
	for _, name := range names {
		var value any
		if err := utiljson.Unmarshal(rawVariables[name], &value); err != nil {
			return nil, fmt.Errorf("variable %s: %w", name, err)
		}
		options = append(options, cel.Variable(name, cel.DynType))
		bindings[name] = value
	}
	envSet, err := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()).Extend(
		environment.VersionedOptions{IntroducedVersion: version.MajorMinor(1, 0), EnvOptions: options})
	if err != nil {
		return nil, err
	}
	env, err := envSet.Env(environment.StoredExpressions)
	if err != nil {
		return nil, err
	}
	activation, err := cel.NewActivation(bindings)
	if err != nil {
		return nil, err
	}
	answers := make([]celAnswer, len(expressions))
	for i, expression := range expressions {
		answers[i] = evaluateOne(env, activation, expression)
	}
	return answers, nil
}

func evaluateOne(env *cel.Env, activation any, expression string) celAnswer {
	ast, issues := env.Compile(expression)
	if issues != nil && issues.Err() != nil {
		return celAnswer{Error: "compilation failed: " + issues.String()}
	}
	program, err := env.Program(ast, cel.InterruptCheckFrequency(celconfig.CheckFrequency))
	if err != nil {
		return celAnswer{Error: "program instantiation failed: " + err.Error()}
	}
	value, details, err := program.Eval(activation)
	var cost uint64
	if details != nil && details.ActualCost() != nil {
		cost = *details.ActualCost()
	}
	if err != nil {
		return celAnswer{Error: err.Error(), Cost: cost}
	}
	out, err := celToJSON(value)
	if err != nil {
		return celAnswer{Error: err.Error(), Cost: cost}
	}
	return celAnswer{Value: out, Cost: cost}
}

// celToJSON is a CEL value as JSON: integers stay integers, bytes are base64,
// maps' keys are written as strings, an optional is its value or null, and
// timestamps and durations are their strings.
func celToJSON(value ref.Val) (any, error) {
	switch v := value.(type) {
	case *types.Err:
		return nil, v
	case types.Null:
		return nil, nil
	case types.Bool, types.Int, types.Uint, types.Double, types.String:
		return v.Value(), nil
	case types.Bytes:
		return base64.StdEncoding.EncodeToString([]byte(v)), nil
	case *types.Optional:
		if !v.HasValue() {
			return nil, nil
		}
		return celToJSON(v.GetValue())
	case traits.Lister:
		out := []any{}
		for it := v.Iterator(); it.HasNext() == types.True; {
			item, err := celToJSON(it.Next())
			if err != nil {
				return nil, err
			}
			out = append(out, item)
		}
		return out, nil
	case traits.Mapper:
		out := map[string]any{}
		for it := v.Iterator(); it.HasNext() == types.True; {
			key := it.Next()
			item, err := celToJSON(v.Get(key))
			if err != nil {
				return nil, err
			}
			out[fmt.Sprint(key.Value())] = item
		}
		return out, nil
	default:
		return fmt.Sprint(v.Value()), nil
	}
}

// celRequest answers the cel op: one expression ({"value"} or {"error"}) or many
// ({"values"}, one of those each).
func celRequest(req *request) any {
	if req.Expression != nil {
		answers, err := evaluateCEL([]string{*req.Expression}, req.Variables)
		if err != nil {
			return map[string]string{"error": err.Error()}
		}
		if answers[0].Error != "" {
			return map[string]any{"error": answers[0].Error, "cost": answers[0].Cost}
		}
		return answers[0]
	}
	answers, err := evaluateCEL(req.Expressions, req.Variables)
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	values := make([]any, len(answers))
	for i, a := range answers {
		if a.Error != "" {
			values[i] = map[string]any{"error": a.Error, "cost": a.Cost}
		} else {
			values[i] = a
		}
	}
	return map[string]any{"values": values}
}
