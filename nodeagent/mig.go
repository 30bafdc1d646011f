package nodeagent

import (
	"context"

	"github.com/hamireg/hamireg/mig"
)

// MIGInstances realises MIG devices on the node (package nvmlscan's MIG manager on a node,
// a simulation in tests). The agent calls it one call at a time, under its Allocate lock.
type MIGInstances interface {
	// Instances lists the MIG devices that exist on the node's GPUs now, whoever created
	// them.
	Instances(ctx context.Context) ([]mig.Instance, error)
	// Create makes a GPU instance of the named profile (as published in the GPU's
	// migProfiles) at exactly placement on the GPU, and a compute instance filling it, and
	// returns the MIG device with its runtime identity. It never chooses another placement.
	Create(ctx context.Context, gpuUUID, profile string, placement mig.Placement) (mig.Instance, error)
	// Destroy removes the MIG device (its compute instance, then its GPU instance).
	Destroy(ctx context.Context, inst mig.Instance) error
}
