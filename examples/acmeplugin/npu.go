package main

import (
	"cmp"
	"context"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nodeagent"
)

// npus are the node's ACME NPUs, the device nodes acme<K> in dir: the agent's device source
// and, since it implements nodeagent.Allocator, its Allocate answer.
type npus struct {
	node, dir     string
	split, memory int32
}

var (
	_ nodeagent.Source    = (*npus)(nil)
	_ nodeagent.Allocator = (*npus)(nil)
	// deviceNode matches the name of an NPU's device node and captures its index.
	deviceNode = regexp.MustCompile(`^acme(0|[1-9][0-9]{0,8})$`)
)

// newNPUs checks the flags' values and, with simulate > 0, creates that many device nodes in
// devRoot (a new temporary folder when devRoot is empty, removed by cleanup).
func newNPUs(node, devRoot string, simulate, split, memory int) (_ *npus, cleanup func(), err error) {
	switch {
	case simulate < 0:
		return nil, nil, fmt.Errorf("--simulate %d is negative", simulate)
	case split < 1 || split > math.MaxInt32:
		return nil, nil, fmt.Errorf("--device-split-count %d is not within [1, %d]", split, math.MaxInt32)
	case memory < 1 || memory > math.MaxInt32:
		return nil, nil, fmt.Errorf("--device-memory %d is not within [1, %d]", memory, math.MaxInt32)
	}
	n := &npus{node: node, dir: devRoot, split: int32(split), memory: int32(memory)}
	cleanup = func() {}
	if simulate == 0 {
		n.dir = cmp.Or(devRoot, "/dev")
		return n, cleanup, nil
	}
	if devRoot == "" {
		if n.dir, err = os.MkdirTemp("", "acme-dev-"); err != nil {
			return nil, nil, err
		}
		cleanup = func() { _ = os.RemoveAll(n.dir) }
	} else if err := os.MkdirAll(devRoot, 0o755); err != nil {
		return nil, nil, err
	}
	for k := range simulate {
		if err := os.WriteFile(filepath.Join(n.dir, "acme"+strconv.Itoa(k)), nil, 0o666); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	return n, cleanup, nil
}

// Devices returns an NPU per device node acme<K>, with an ID that stays the same for the node
// and K across restarts (the scheduler's pod annotations name it).
func (n *npus) Devices(context.Context) ([]annotation.Device, []error, error) {
	entries, err := os.ReadDir(n.dir)
	if err != nil {
		return nil, nil, err
	}
	var devs []annotation.Device
	for _, e := range entries {
		m := deviceNode.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		k, _ := strconv.Atoi(m[1])
		id := fmt.Sprintf("ACME-%d-%08x", k, crc32.ChecksumIEEE([]byte(n.node+"/"+e.Name())))
		devs = append(devs, annotation.Device{ID: id, Index: uint(k), Count: n.split, Devmem: n.memory, Devcore: 100, Type: "ACME-NPU", Health: true})
	}
	return devs, nil, nil
}

// Changed is nil: the agent rescans every 30 s.
func (n *npus) Changed() <-chan struct{} { return nil }

// Allocate answers for the container's NPUs, in the scheduler's order: the device node of
// each, ACME_VISIBLE_DEVICES and the memory limit of each share.
// snippet: README
func (n *npus) Allocate(_ context.Context, req nodeagent.ContainerRequest) (allocation.Response, error) {
	resp := allocation.Response{Envs: map[string]string{}}
	ids := make([]string, len(req.Devices))
	for i, d := range req.Devices {
		j := slices.IndexFunc(req.NodeDevices, func(nd annotation.Device) bool { return nd.ID == d.UUID })
		if j < 0 {
			return allocation.Response{}, fmt.Errorf("NPU %s is not one of node %s", d.UUID, n.node)
		}
		name := fmt.Sprintf("acme%d", req.NodeDevices[j].Index)
		resp.DeviceNodes = append(resp.DeviceNodes, allocation.DeviceNode{ContainerPath: "/dev/" + name, HostPath: filepath.Join(n.dir, name), Permissions: "rw"})
		resp.Envs["ACME_MEMORY_LIMIT_"+strconv.Itoa(i)] = strconv.Itoa(int(d.Usedmem))
		ids[i] = d.UUID
	}
	resp.Envs["ACME_VISIBLE_DEVICES"] = strings.Join(ids, ",")
	return resp, nil
}

// end snippet
