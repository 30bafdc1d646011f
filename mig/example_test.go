package mig_test

import (
	"errors"
	"fmt"

	"github.com/hamireg/hamireg/mig"
)

// The node side of a reservation: decode what the scheduler wrote, realise each device of a
// container, record the runtime identity and encode the annotation back.
func Example() {
	annotations := map[string]string{
		mig.KeyAllocations: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0a1b","profile":"2g.10gb","placement":{"start":2,"size":2}}]`,
	}
	const containerIndex = 0

	allocs, err := mig.DecodeAllocations(annotations[mig.KeyAllocations])
	if err != nil {
		fmt.Println(errors.Is(err, mig.ErrMalformed))
		return
	}
	for _, a := range mig.Find(allocs, containerIndex) {
		if !a.Realized() {
			// Create the instance of a.Profile at a.Placement on a.GPUUUID, then:
			runtime := mig.Runtime{MigUUID: "MIG-5a5a", GPUInstanceID: 1, ComputeInstanceID: 0}
			allocs, _ = mig.WithRuntime(allocs, a.ContainerIndex, a.DeviceIndex, runtime)
		}
	}
	fmt.Println(mig.EncodeAllocations(allocs))

	nvmlName := "NVIDIA H200"
	profiles, entry, others := mig.DefaultAllowlist().Match(nvmlName, mig.MatchWord)
	fmt.Println(profiles, entry, others)
	_, hamiEntry, _ := mig.ChartAllowlist().Match(nvmlName, mig.MatchSubstring)
	fmt.Println(mig.ChartAllowlist()[hamiEntry].Profiles)
	// Output:
	// [{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0a1b","profile":"2g.10gb","placement":{"start":2,"size":2},"migUUID":"MIG-5a5a","gpuInstanceID":1,"computeInstanceID":0}]
	// [1g.18gb 2g.35gb 3g.71gb 7g.141gb] 6 []
	// [1g.12gb 2g.24gb 3g.48gb 7g.96gb]
}

func ExampleParseAllowlist() {
	l, err := mig.ParseAllowlist([]byte(`
nvidia:
  migProfileAllowlist:
  - models: ["A100-SXM4-40GB", "A100-PCIE-40GB"]
    profiles: ["1g.5gb", "3g.20gb"]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	profiles, entry, _ := l.Match("Mock NVIDIA A100-SXM4-40GB", mig.MatchWord)
	fmt.Println(profiles, entry)

	_, err = mig.ParseAllowlist([]byte(`[{"models": ["A30"], "profiles": ["6gb"]}]`))
	fmt.Println(errors.Is(err, mig.ErrInvalidAllowlist), err)
	// Output:
	// [1g.5gb 3g.20gb] 0
	// true invalid MIG profile allowlist: entry 0: profile "6gb" is not <N>g.<name>
}

func ExampleParseLegacyUUID() {
	gpu, template, position, suffixed, err := mig.ParseLegacyUUID("GPU-0a1b[1-2]")
	fmt.Println(gpu, template, position, suffixed, err)
	_, _, _, _, err = mig.ParseLegacyUUID("GPU-0a1b[0-99999999999999999999]")
	fmt.Println(errors.Is(err, mig.ErrMalformed))
	fmt.Println(mig.FormatLegacyUUID("GPU-0a1b", 0, 6))
	// Output:
	// GPU-0a1b 1 2 true <nil>
	// true
	// GPU-0a1b[0-6]
}
