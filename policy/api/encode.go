package api

import (
	"bytes"
	"encoding/json"
	"fmt"

	"gopkg.in/yaml.v3"
)

// List is how several policies are printed (as calicoctl does).
type List struct {
	APIVersion string                `json:"apiVersion"`
	Kind       string                `json:"kind"`
	Items      []GlobalNetworkPolicy `json:"items"`
}

// NewList wraps policies for printing.
func NewList(ps []GlobalNetworkPolicy) List {
	if ps == nil {
		ps = []GlobalNetworkPolicy{}
	}
	return List{APIVersion: APIVersion, Kind: KindPolicyList, Items: ps}
}

// JSON is the indented JSON of a policy or a List.
func JSON(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// YAML is the YAML of a policy or a List, field names as in JSON (keys
// sorted, like calicoctl's output); Decode reads it back unchanged.
func YAML(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var generic any
	if err := json.Unmarshal(b, &generic); err != nil {
		return nil, fmt.Errorf("re-reading %T: %w", v, err)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(generic); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ListOf is how several host endpoints or network sets are printed.
type ListOf[T any] struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Items      []T    `json:"items"`
}

// NewHostEndpointList wraps host endpoints for printing.
func NewHostEndpointList(hs []HostEndpoint) ListOf[HostEndpoint] {
	return ListOf[HostEndpoint]{APIVersion: APIVersion, Kind: KindHostEndpointList, Items: nonNil(hs)}
}

// NewNetworkSetList wraps network sets for printing.
func NewNetworkSetList(ns []GlobalNetworkSet) ListOf[GlobalNetworkSet] {
	return ListOf[GlobalNetworkSet]{APIVersion: APIVersion, Kind: KindNetworkSetList, Items: nonNil(ns)}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
