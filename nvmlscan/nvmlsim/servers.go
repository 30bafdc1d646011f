package nvmlsim

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// ErrUnknownServer is returned by [New] for a name that [Servers] does not list.
var ErrUnknownServer = errors.New("unknown simulated server")

// servers maps the names [New] accepts to go-nvml's constructors.
func servers() map[string]func() *server.Server {
	return map[string]func() *server.Server{"dgxa100": dgxa100.New, "dgxb200": dgxb200.New, "dgxh100": dgxh100.New, "dgxh200": dgxh200.New}
}

// Servers returns the names of the simulated servers [New] builds, sorted: dgxa100, dgxb200,
// dgxh100 and dgxh200 (go-nvml's mock packages of those names, eight GPUs each).
func Servers() []string {
	names := make([]string, 0, 4)
	for name := range servers() {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// New builds go-nvml's simulated server of that name (see [Servers]) and wires it with
// [Wire]. The GPUs' UUIDs are random, drawn by go-nvml.
func New(name string) (*Node, error) {
	newServer, ok := servers()[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (%s)", ErrUnknownServer, name, strings.Join(Servers(), ", "))
	}
	return Wire(newServer())
}
