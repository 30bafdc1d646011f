package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

const versionUsage = `Usage:
  {cmd} version [-o text|json|yaml]   the doctor's version, the Go it was built with and
                                      the version of the SDK (github.com/hamireg/hamireg) in it
`

// sdkModule is the SDK's module path: the doctor's dependency whose version version prints.
const sdkModule = "github.com/hamireg/hamireg"

// versionInfo is version's -o json and yaml form.
type versionInfo struct {
	// Version is the doctor's module version: "v0.1.0" when installed with go install
	// …@v0.1.0, "(devel)" when built in a checkout.
	Version string `json:"version"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"goVersion"`
	// SDKVersion is the version of github.com/hamireg/hamireg built in: the required
	// release, or "(devel)" when the workspace or a replace put a folder in its place
	// (SDKReplace names it).
	SDKVersion string `json:"sdkVersion"`
	SDKReplace string `json:"sdkReplace,omitempty"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// buildVersion reads the versions from the build information of the binary (ok false when
// it carries none, as a binary built without module support).
func buildVersion(bi *debug.BuildInfo, ok bool) versionInfo {
	v := versionInfo{Version: "unknown", GoVersion: runtime.Version(), SDKVersion: "unknown", Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if !ok || bi == nil {
		return v
	}
	if bi.GoVersion != "" {
		v.GoVersion = bi.GoVersion
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, m := range bi.Deps {
		if m.Path != sdkModule {
			continue
		}
		v.SDKVersion = m.Version
		if r := m.Replace; r != nil {
			v.SDKVersion = r.Version
			v.SDKReplace = r.Path
			if r.Version == "" {
				v.SDKVersion = "(devel)"
			}
		}
	}
	if v.SDKVersion == "unknown" && bi.Main.Path == sdkModule {
		v.SDKVersion = v.Version // built as part of the SDK's own module
	}
	return v
}

func (c *cli) versionCmd(args []string) int {
	fs, output := c.newFlags("version", versionUsage)
	if err := parse(fs, args); err != nil {
		return c.fail("version", fs, err)
	}
	if fs.NArg() > 0 {
		return c.fail("version", fs, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args()))
	}
	if err := checkOutput(*output); err != nil {
		return c.fail("version", fs, err)
	}
	v := buildVersion(c.buildInfo())
	return c.show("version", *output, document{kindVersion, v}, func() {
		fmt.Fprintf(c.stdout, "%s %s\n", c.name, v.Version)
		fmt.Fprintf(c.stdout, "  go:  %s %s\n", v.GoVersion, v.Platform)
		sdk := sdkModule + " " + v.SDKVersion
		if v.SDKReplace != "" {
			sdk += " => " + v.SDKReplace
		}
		fmt.Fprintf(c.stdout, "  sdk: %s\n", sdk)
	}, false)
}
