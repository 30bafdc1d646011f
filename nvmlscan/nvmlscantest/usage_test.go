package nvmlscantest_test

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/hamireg/hamireg/nvmlscan/nvmlscantest"
	"github.com/hamireg/hamireg/nvmlscan/nvmlsim"
)

// fatalTB records Fatal instead of ending the test.
type fatalTB struct {
	testing.TB
	fatal []any
}

func (f *fatalTB) Helper()           {}
func (f *fatalTB) Fatal(args ...any) { f.fatal = append(f.fatal, args...) }

func TestSetReturn(t *testing.T) {
	t.Parallel()
	node := nvmlscantest.NewNode(t, dgxa100.New())
	nvmlscantest.SetReturn(t, node, 2, nvmlsim.QueryUtilizationRates, nvml.ERROR_NOT_SUPPORTED)
	if _, ret := node.Device(2).GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetUtilizationRates = %v, want ERROR_NOT_SUPPORTED", ret)
	}
	tb := &fatalTB{TB: t}
	nvmlscantest.SetReturn(tb, node, 2, "GetFanSpeed", nvml.ERROR_UNKNOWN)
	var err error
	if len(tb.fatal) == 1 {
		err, _ = tb.fatal[0].(error)
	}
	if !errors.Is(err, nvmlsim.ErrUnknownQuery) {
		t.Errorf("unknown query: Fatal(%v), want ErrUnknownQuery", tb.fatal)
	}
}
