// Command nvmlscan prints the device-specification annotation this node would publish for HAMi
// (hami.io/node-nvidia-register): the GPUs as a table, then the raw value, byte for byte what
// HAMi's node agent writes for the same devices. Run it on a GPU node, in the device plugin's
// container or any container that gets the NVIDIA driver:
//
//	nvmlscan
//	nvmlscan -split-count 4 -memory-scaling 1.5 -core-scaling 0.5 -shape v2.9.0
//	nvmlscan -watch 1m   # watch for XID errors for a minute before scanning
//	nvmlscan -mode mig -mig-allowlist allowlist.yaml -mig-model-match substring -mig-profiles all
//
// The flags mirror HAMi's chart (deviceSplitCount, deviceMemoryScaling, deviceCoreScaling,
// preConfiguredDeviceMemory, operatingmode, filterdevices, migProfileAllowlist). In mig mode
// the MIG profiles each GPU publishes are listed too (master shape; the v2.9.0 shape
// publishes none); -mig-allowlist reads the allowlist as HAMi's device ConfigMap holds it
// (YAML: the migProfileAllowlist list, or the document around it), the SDK's default
// allowlist otherwise. GPUs whose NVML queries fail are
// listed with the error and left out, as the SDK's device plugin would do; HAMi's would crash.
//
// Exit status: 0 when at least one GPU would register; 1 when NVML cannot be initialised (the
// classified error says why, e.g. the container did not get the driver) or no GPU registers;
// 2 on usage errors.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/mig"
	"github.com/hamireg/hamireg/nvmlscan"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], nvml.New(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the command with its NVML library and output injected, for tests.
func run(ctx context.Context, args []string, lib nvml.Interface, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("nvmlscan", flag.ContinueOnError)
	flags.SetOutput(stderr)
	splitCount := flags.Int("split-count", int(nvmlscan.DefaultSplitCount), "tasks per GPU (deviceSplitCount)")
	memScaling := flags.Float64("memory-scaling", 1, "memory scaling (deviceMemoryScaling); not applied in mig mode")
	coreScaling := flags.Float64("core-scaling", 1, "core scaling (deviceCoreScaling); not applied in mig mode")
	preConfigured := flags.Int64("preconfigured-memory", 0, "MiB to assume for GPUs that do not report memory (preConfiguredDeviceMemory)")
	mode := flags.String("mode", nvmlscan.ModeHAMiCore, "operating mode: hami-core, mig or mps")
	excludeUUIDs := flags.String("exclude-uuids", "", "comma-separated GPU UUIDs not to register (filterdevices.uuid)")
	excludeIndexes := flags.String("exclude-indexes", "", "comma-separated GPU indexes not to register (filterdevices.index)")
	sysfs := flags.String("sysfs", "/sys", "sysfs root, for the GPUs' NUMA nodes")
	shape := flags.String("shape", "master", "wire shape: master (HAMi v2.10+) or v2.9.0")
	watch := flags.Duration("watch", 0, "watch for XID errors this long before scanning (0: scan at once)")
	migAllowlist := flags.String("mig-allowlist", "", "YAML file with the migProfileAllowlist (default: the SDK's default allowlist)")
	var migMatch mig.MatchRule
	flags.TextVar(&migMatch, "mig-model-match", mig.MatchWord, "how allowlist models match NVML names: word (word-bounded) or substring (HAMi's)")
	var migProfiles nvmlscan.MIGDiscovery
	flags.TextVar(&migProfiles, "mig-profiles", nvmlscan.MIGDiscoveryBaseSlices, "MIG profile discovery: base (HAMi's base-slice profiles) or all (every profile id, REV profiles correct)")
	verbosity := flags.Int("v", 0, "log verbosity (logs go to stderr)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if flags.NArg() > 0 {
		fmt.Fprintf(stderr, "nvmlscan: unexpected arguments %q\n", flags.Args())
		return 2
	}
	var wireShape annotation.Shape
	switch *shape {
	case "master":
		wireShape = annotation.ShapeMaster
	case "v2.9.0":
		wireShape = annotation.ShapeV290
	default:
		fmt.Fprintf(stderr, "nvmlscan: -shape %q is neither master nor v2.9.0\n", *shape)
		return 2
	}
	if *splitCount < 0 || *splitCount > math.MaxInt32 {
		fmt.Fprintf(stderr, "nvmlscan: -split-count: split count %d is not within [0, %d]\n", *splitCount, math.MaxInt32)
		return 2
	}
	migOpts, err := parseMIG(*migAllowlist, migMatch, migProfiles)
	if err != nil {
		fmt.Fprintf(stderr, "nvmlscan: %v\n", err)
		return 2
	}
	migOpts.MIGVersion = wireShape
	indexes, err := parseIndexes(*excludeIndexes)
	if err != nil {
		fmt.Fprintf(stderr, "nvmlscan: -exclude-indexes: %v\n", err)
		return 2
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(*verbosity), textlogger.Output(stderr)))
	ctx = klog.NewContext(ctx, logger)

	opts := migOpts
	opts.SplitCount = int32(*splitCount)
	opts.MemoryScaling = memScaling
	opts.CoreScaling = coreScaling
	opts.PreConfiguredMemory = *preConfigured
	opts.Mode = *mode
	opts.ExcludeUUIDs = splitList(*excludeUUIDs)
	opts.ExcludeIndexes = indexes
	opts.Sysfs = os.DirFS(*sysfs)
	s, err := nvmlscan.New(lib, opts)
	if errors.Is(err, nvmlscan.ErrInvalidOptions) {
		fmt.Fprintf(stderr, "nvmlscan: %v\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "nvmlscan: %v\n", err)
		return 1
	}
	defer func() {
		if err := s.Close(); err != nil {
			fmt.Fprintf(stderr, "nvmlscan: %v\n", err)
		}
	}()

	if *watch > 0 {
		wctx, cancel := context.WithTimeout(ctx, *watch)
		err := s.Run(wctx)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "nvmlscan: %v\n", err)
			return 1
		}
	}
	res, err := s.Scan(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "nvmlscan: %v\n", err)
		return 1
	}
	printResult(stdout, res, s.Unhealthy(), wireShape)
	if len(res.Devices) == 0 {
		fmt.Fprintln(stderr, "nvmlscan: no GPU would register")
		return 1
	}
	return 0
}

func printResult(w io.Writer, res nvmlscan.Result, unhealthy []nvmlscan.DeviceHealth, shape annotation.Shape) {
	fmt.Fprintf(w, "GPUs that would register (%d):\n", len(res.Devices))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tUUID\tTYPE\tDEVMEM (MiB)\tDEVCORE\tCOUNT\tNUMA\tMODE\tHEALTH")
	for _, d := range res.Devices {
		h := "healthy"
		if !d.Health {
			h = "UNHEALTHY"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", d.Index, d.ID, d.Type, d.Devmem, d.Devcore, d.Count, d.Numa, d.Mode, h)
	}
	_ = tw.Flush()
	for _, d := range res.Devices {
		if len(d.MIGProfiles) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nMIG profiles of GPU %d (%s):\n", d.Index, d.ID)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PROFILE\tMEMORY (MiB)\tCORE\tSLICES\tPLACEMENTS")
		for _, p := range d.MIGProfiles {
			pls := make([]string, len(p.Placements))
			for i, pl := range p.Placements {
				pls[i] = fmt.Sprintf("%d+%d", pl.Start, pl.Size)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", p.Name, p.MemoryMB, p.Core, p.SliceCount, strings.Join(pls, " "))
		}
		_ = tw.Flush()
	}
	if len(res.Failed) > 0 {
		fmt.Fprintf(w, "\nGPUs left out because NVML failed (%d):\n", len(res.Failed))
		for _, f := range res.Failed {
			fmt.Fprintf(w, "  %v\n", f)
		}
	}
	if res.Excluded > 0 {
		fmt.Fprintf(w, "\nGPUs excluded by -exclude-uuids/-exclude-indexes: %d\n", res.Excluded)
	}
	for _, u := range unhealthy {
		fmt.Fprintf(w, "\nUnhealthy %s since %s: %s\n", u.UUID, u.Since.Format(time.RFC3339), u.Reason)
	}
	value := annotation.EncodeShape(res.Devices, shape)
	fmt.Fprintf(w, "\nAnnotation %s (HAMi %s shape, %d bytes):\n%s\n", annotation.KeyNVIDIARegister, shape, len(value), value)
}

// parseMIG turns the MIG flags into the scanner's MIG options.
func parseMIG(allowlistFile string, match mig.MatchRule, profiles nvmlscan.MIGDiscovery) (nvmlscan.Options, error) {
	opts := nvmlscan.Options{MIGModelMatch: match, MIGProfileDiscovery: profiles}
	if allowlistFile != "" {
		data, err := os.ReadFile(allowlistFile)
		if err != nil {
			return opts, fmt.Errorf("-mig-allowlist: %w", err)
		}
		if opts.MIGAllowlist, err = mig.ParseAllowlist(data); err != nil {
			return opts, fmt.Errorf("-mig-allowlist %s: %w", allowlistFile, err)
		}
		if opts.MIGAllowlist == nil {
			opts.MIGAllowlist = mig.Allowlist{} // an empty file: no profile for any GPU
		}
	}
	return opts, nil
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseIndexes(s string) ([]uint, error) {
	var out []uint
	for _, f := range splitList(s) {
		n, err := strconv.ParseUint(f, 10, 0)
		if err != nil {
			return nil, fmt.Errorf("parse index %q: %w", f, err)
		}
		out = append(out, uint(n))
	}
	return out, nil
}
