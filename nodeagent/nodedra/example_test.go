package nodedra_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/nodeagent/nodedra"
)

// A node program opts into DRA by building a World and handing it to the agent.
func Example() {
	run := func(ctx context.Context, client kubernetes.Interface, nodeName string, scanner nodeagent.Source) error {
		// snippet: doc
		world, err := nodedra.New(client, nodeName, nodedra.Options{
			Plugin: draplugin.Options{Profile: dra.SDKProfile()},
			GPUs:   []string{"6", "7"}, // UUIDs or NVML indexes DRA owns; empty: all
		})
		if err != nil {
			return err
		}
		agent, err := nodeagent.New(client, nodeName, scanner, nodeagent.Options{DRA: world})
		if err != nil {
			return err
		}
		return agent.Run(ctx) // runs the world too
		// end snippet
	}
	_ = run

	dir, err := os.MkdirTemp("", "nodedra")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	world, err := nodedra.New(clienttest.NewClientset(), "gpu-1", nodedra.Options{
		Plugin: draplugin.Options{Profile: dra.SDKProfile(), PluginDir: dir, RegistrarDir: dir},
		GPUs:   []string{"1", "GPU-3"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := range uint(4) {
		d := annotation.Device{ID: fmt.Sprintf("GPU-%d", i), Index: i, Mode: "hami-core"}
		fmt.Printf("%s owned by DRA: %v\n", d.ID, world.Owns(d))
	}
	_, err = nodedra.New(clienttest.NewClientset(), "gpu-1", nodedra.Options{GPUs: []string{"0,1"}})
	fmt.Println(errors.Is(err, nodedra.ErrInvalidOptions))
	// Output:
	// GPU-0 owned by DRA: false
	// GPU-1 owned by DRA: true
	// GPU-2 owned by DRA: false
	// GPU-3 owned by DRA: true
	// true
}
