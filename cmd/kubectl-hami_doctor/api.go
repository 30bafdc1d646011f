package main

import (
	"context"
	"io"

	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/diagnose"
)

// The support bundle's types, as the bundle verb and its tests spell them.
type (
	bundleTarget  = diagnose.BundleTarget
	bundleFile    = diagnose.BundleFile
	bundleOptions = diagnose.BundleOptions
	bundleIndex   = diagnose.BundleIndex
)

// diagnoseAPI is the part of package diagnose the unlock, bundle, cordon and uncordon verbs call; tests
// replace it to see what the verbs pass.
type diagnoseAPI struct {
	lockOf          func(ctx context.Context, client kubernetes.Interface, node string, opts diagnose.Options) (*diagnose.LockState, error)
	removeStaleLock func(ctx context.Context, client kubernetes.Interface, shown diagnose.LockState, opts diagnose.Options) error
	writeBundle     func(ctx context.Context, client kubernetes.Interface, target bundleTarget, w io.Writer, opts bundleOptions) (*bundleIndex, error)
	cordon          func(ctx context.Context, client kubernetes.Interface, node string, gpus []string, opts diagnose.CordonOptions) (*diagnose.CordonResult, error)
	uncordon        func(ctx context.Context, client kubernetes.Interface, node string, gpus []string, opts diagnose.CordonOptions) (*diagnose.CordonResult, error)
}

// defaultAPI returns package diagnose's functions.
func defaultAPI() diagnoseAPI {
	return diagnoseAPI{lockOf: diagnose.LockOf, removeStaleLock: diagnose.RemoveStaleLock, writeBundle: diagnose.WriteBundle,
		cordon: diagnose.Cordon, uncordon: diagnose.Uncordon}
}
