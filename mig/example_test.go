package mig_test

import (
	"errors"
	"fmt"

	"github.com/hamireg/hamireg/mig"
)

// realize is the package doc's usage snippet.
func realize(annotations map[string]string, containerIndex int, runtime mig.Runtime, nvmlName string) (string, []string, error) {
	// snippet: doc
	allocs, err := mig.DecodeAllocations(annotations[mig.KeyAllocations])
	if err != nil {
		return "", nil, err // errors.Is(err, mig.ErrMalformed)
	}
	for _, a := range mig.Find(allocs, containerIndex) {
		if !a.Realized() {
			// Create the instance of a.Profile at a.Placement on a.GPUUUID, then:
			allocs, _ = mig.WithRuntime(allocs, a.ContainerIndex, a.DeviceIndex, runtime)
		}
	}
	value := mig.EncodeAllocations(allocs) // merge-patch it under mig.KeyAllocations

	profiles, entry, others := mig.DefaultAllowlist().Match(nvmlName, mig.MatchWord)
	if entry < 0 || len(others) > 0 { // no entry, or an ambiguous allowlist
		return value, nil, fmt.Errorf("%q matches entry %d and also %v", nvmlName, entry, others)
	}
	// end snippet
	return value, profiles, nil
}

// The node side of a reservation: decode what the scheduler wrote, realise each device of a
// container, record the runtime identity and encode the annotation back; the profiles of an
// H200 under the SDK's default allowlist and under HAMi's chart and match.
func Example() {
	annotations := map[string]string{
		mig.KeyAllocations: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0a1b","profile":"2g.10gb","placement":{"start":2,"size":2}}]`,
	}
	runtime := mig.Runtime{MigUUID: "MIG-5a5a", GPUInstanceID: 1, ComputeInstanceID: 0}
	value, profiles, err := realize(annotations, 0, runtime, "NVIDIA H200")
	fmt.Println(value, err)
	fmt.Println(profiles)

	_, hamiEntry, _ := mig.ChartAllowlist().Match("NVIDIA H200", mig.MatchSubstring)
	fmt.Println(mig.ChartAllowlist()[hamiEntry].Profiles)

	_, _, err = realize(map[string]string{mig.KeyAllocations: `[{"containerIndex":-1}]`}, 0, runtime, "NVIDIA H200")
	fmt.Println(errors.Is(err, mig.ErrMalformed), err)
	// Output:
	// [{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0a1b","profile":"2g.10gb","placement":{"start":2,"size":2},"migUUID":"MIG-5a5a","gpuInstanceID":1,"computeInstanceID":0}] <nil>
	// [1g.18gb 2g.35gb 3g.71gb 7g.141gb]
	// [1g.12gb 2g.24gb 3g.48gb 7g.96gb]
	// true malformed MIG value: MIG allocation 0 has negative containerIndex -1
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
