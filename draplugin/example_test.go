package draplugin_test

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
)

// A node agent's DRA wiring: New, SetDevices after every scan, Run until the agent stops.
// (It needs the kubelet's folders and the API server, so it has no output here.)
func ExamplePlugin_Run() {
	run := func(ctx context.Context, client kubernetes.Interface, nodeName string, scan []annotation.Device) error {
		profile := dra.SDKProfile()
		p, err := draplugin.New(draplugin.Options{
			Profile:  profile,
			Client:   client,
			NodeName: nodeName,
			Refuse: func(ctx context.Context, gpus []annotation.Device) error {
				return nil // the node agent refuses the GPUs the device-plugin world owns
			},
		})
		if err != nil {
			return err
		}
		devices, err := dra.Devices(scan, dra.Options{Profile: profile})
		if err != nil {
			return err
		}
		p.SetDevices(scan, devices) // again after each scan: an unchanged scan writes nothing
		return p.Run(ctx)
	}
	_ = run
}

// The plugin's RBAC, for the node agent's ClusterRole.
func ExampleClusterRoleRules() {
	for _, r := range draplugin.ClusterRoleRules() {
		fmt.Println(r.APIGroups, r.Resources, r.Verbs)
	}
	// Output:
	// [resource.k8s.io] [resourceslices] [get list watch create update delete]
	// [resource.k8s.io] [resourceclaims] [get]
	// [] [nodes] [get]
}

// New validates the options and fills in the defaults; it starts nothing.
func ExampleNew() {
	_, err := draplugin.New(draplugin.Options{Profile: dra.SDKProfile(), NodeName: "node-a"})
	fmt.Println(err)
	// Output:
	// invalid DRA plugin options: Options.Client is nil: pass the node agent's Kubernetes client (it reads claims and writes ResourceSlices)
}
