package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/diagnose"
)

// The repair and the support bundle are written in package diagnose on branches bind
// (LockOf, RemoveStaleLock) and bundle (WriteBundle and its types). Until they are merged,
// this file holds their signatures so the verbs compile; merging replaces defaultAPI's
// bodies with the diagnose functions and the bundle types below with diagnose's.

// bundleTarget is diagnose.BundleTarget: a node, or a pod by namespace and name.
type bundleTarget struct {
	Node, Namespace, Pod string
}

// bundleFile is diagnose.BundleFile: a file the caller adds to the bundle.
type bundleFile struct {
	Name string
	Data []byte
}

// bundleOptions is diagnose.BundleOptions.
type bundleOptions struct {
	diagnose.Options
	LogLines int64
	Files    []bundleFile
}

// bundleIndex is diagnose.BundleIndex: the files written and what could not be collected.
type bundleIndex struct {
	Files   []string `json:"files"`
	Missing []string `json:"missing,omitempty"`
}

// diagnoseAPI is the part of package diagnose the unlock and bundle verbs call; tests
// replace it.
type diagnoseAPI struct {
	lockOf          func(ctx context.Context, client kubernetes.Interface, node string, opts diagnose.Options) (*diagnose.LockState, error)
	removeStaleLock func(ctx context.Context, client kubernetes.Interface, shown diagnose.LockState, opts diagnose.Options) error
	writeBundle     func(ctx context.Context, client kubernetes.Interface, target bundleTarget, w io.Writer, opts bundleOptions) (*bundleIndex, error)
}

// errNotBuilt says the verb's part of package diagnose is not in this build.
var errNotBuilt = errors.New("not in this build of package diagnose")

// defaultAPI returns package diagnose's functions.
func defaultAPI() diagnoseAPI {
	return diagnoseAPI{
		lockOf: func(context.Context, kubernetes.Interface, string, diagnose.Options) (*diagnose.LockState, error) {
			return nil, fmt.Errorf("diagnose.LockOf: %w (merge branch bind)", errNotBuilt)
		},
		removeStaleLock: func(context.Context, kubernetes.Interface, diagnose.LockState, diagnose.Options) error {
			return fmt.Errorf("diagnose.RemoveStaleLock: %w (merge branch bind)", errNotBuilt)
		},
		writeBundle: func(context.Context, kubernetes.Interface, bundleTarget, io.Writer, bundleOptions) (*bundleIndex, error) {
			return nil, fmt.Errorf("diagnose.WriteBundle: %w (merge branch bundle)", errNotBuilt)
		},
	}
}
