package main

import (
	"encoding/json"
	"fmt"
)

// apiVersion is the apiVersion of every document the doctor prints with -o json or -o yaml;
// its kind names the shape (the kind… constants). docs/doctor.md documents the schema.
const apiVersion = "doctor.hamireg.io/v1alpha1"

// The kinds of the documents, one per verb. A …List carries its elements under items.
const (
	kindNodeReport     = "NodeReport"
	kindNodeReportList = "NodeReportList"
	kindPodReport      = "PodReport"
	kindPodReportList  = "PodReportList"
	kindUnlockResult   = "UnlockResult"
	kindCordonResult   = "CordonResult"
	kindBundleResult   = "BundleResult"
	kindExplanation    = "Explanation"
	kindVersion        = "Version"
)

// typeMeta is what a script reads first to know what it got.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// document is body, a value that encodes as a JSON object, with apiVersion and kind in
// front of its own fields, as a Kubernetes object carries them.
type document struct {
	kind string
	body any
}

// list is a document of kind whose items are items.
func list[T any](kind string, items []T) document {
	if items == nil {
		items = []T{}
	}
	return document{kind: kind, body: struct {
		Items []T `json:"items"`
	}{items}}
}

// MarshalJSON writes {"apiVersion":…,"kind":…, and the body's fields}.
func (d document) MarshalJSON() ([]byte, error) {
	head, err := json.Marshal(typeMeta{APIVersion: apiVersion, Kind: d.kind})
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(d.body)
	if err != nil {
		return nil, err
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("encode %s: not a JSON object", d.kind)
	}
	if string(body) == "{}" {
		return head, nil
	}
	return append(append(head[:len(head)-1], ','), body[1:]...), nil
}
