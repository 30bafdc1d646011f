package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// Exit statuses.
const (
	exitRegisters    = 0
	exitNotRegisters = 1
	exitUsage        = 2
)

const usage = `Usage:
  doctor explain [flags] VALUE     explain a register annotation value
  doctor explain [flags] -f FILE   read the value from a file
  doctor explain [flags] -         read the value from standard input
  doctor node NAME [flags]         diagnose one node in the cluster: channels, case 1-5, fixes
  doctor nodes [flags]             one line per GPU node in the cluster

explain: exit status 0 when the node would register, 1 when it would not, 2 on usage errors.
node, nodes: exit status 0 when healthy, 1 when a case applies, 2 on errors.
Run "doctor node -h" for the cluster flags (--kubeconfig, --namespace, -o json, ...).
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "explain":
		return explain(args[1:], stdin, stdout, stderr)
	case "node":
		return nodeCmd(args[1:], stdout, stderr)
	case "nodes":
		return nodesCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitRegisters
	default:
		fmt.Fprintf(stderr, "doctor: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

func explain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "read the annotation value from `FILE`")
	vendorName := fs.String("vendor", annotation.VendorNVIDIA, "HAMi vendor word whose annotation this is (NVIDIA, DCU, XPU, Vastai, biren, an Ascend or Iluvatar chip)")
	hs := fs.String("handshake", "", "also interpret this handshake annotation `VALUE` (hami.io/node-handshake)")
	alloc := fs.Int64("allocatable", -1, "allocatable count of the vendor's resource (e.g. nvidia.com/gpu), for --handshake")
	hamiVersion := fs.String("hami-version", "master", "HAMi semantics for --handshake: master or v2.9.0")
	fs.Usage = func() { fmt.Fprint(stderr, usage, "\nFlags:\n"); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	vendor, ok := annotation.VendorByName(*vendorName)
	if !ok {
		vendor, ok = vendorByChip(*vendorName)
	}
	if !ok {
		fmt.Fprintf(stderr, "doctor: unknown vendor %q\n", *vendorName)
		return exitUsage
	}
	value, err := readValue(fs.Args(), *file, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "doctor: %v\n\n%s", err, usage)
		return exitUsage
	}
	verdict := annotation.Check(vendor, map[string]string{vendor.RegisterKey: value})
	printVerdict(stdout, vendor, verdict)
	registers := verdict.Registers
	if *hs != "" || *alloc >= 0 {
		var version handshake.Version
		switch *hamiVersion {
		case "master", "":
		case "v2.9.0", "2.9.0":
			version = handshake.VersionV290
		default:
			fmt.Fprintf(stderr, "doctor: unknown --hami-version %q (master or v2.9.0)\n", *hamiVersion)
			return exitUsage
		}
		healthy := printHandshake(stdout, vendor, *hs, *alloc, version)
		registers = registers && healthy
	}
	if registers {
		return exitRegisters
	}
	return exitNotRegisters
}

func vendorByChip(name string) (annotation.Vendor, bool) {
	switch {
	case strings.HasPrefix(name, "Ascend"):
		return annotation.Ascend(name), true
	case strings.HasPrefix(name, "MR-") || strings.HasPrefix(name, "BI-"):
		return annotation.Iluvatar(name), true
	}
	return annotation.Vendor{}, false
}

func readValue(args []string, file string, stdin io.Reader) (string, error) {
	switch {
	case file != "" && len(args) > 0:
		return "", errors.New("give the value either as an argument or with -f, not both")
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read value: %w", err)
		}
		return strings.TrimSuffix(string(data), "\n"), nil
	case len(args) == 1 && args[0] == "-":
		data, err := io.ReadAll(stdin)
		if err != nil {
			return "", fmt.Errorf("read standard input: %w", err)
		}
		return strings.TrimSuffix(string(data), "\n"), nil
	case len(args) == 1:
		return args[0], nil
	case len(args) == 0:
		return "", errors.New("no annotation value given")
	default:
		return "", fmt.Errorf("expected one value, got %d arguments (quote the JSON)", len(args))
	}
}

func printVerdict(w io.Writer, vendor annotation.Vendor, v annotation.Verdict) {
	fmt.Fprintf(w, "Annotation %s (vendor %s)\n\n", vendor.RegisterKey, vendor.Name)
	if v.Registers {
		fmt.Fprintf(w, "Devices (%d):\n", len(v.Devices))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INDEX\tID\tTYPE\tMEMORY(MiB)\tCORE(%)\tSPLIT\tNUMA\tMODE\tHEALTH")
		unhealthy := 0
		for _, d := range v.Devices {
			health := "healthy"
			if !d.Health {
				health = "UNHEALTHY"
				unhealthy++
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", d.Index, orDash(d.ID), orDash(d.Type), d.Devmem, d.Devcore, d.Count, d.Numa, orDash(d.Mode), health)
		}
		_ = tw.Flush()
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Verdict: HAMi's scheduler accepts this device list: the node registers for %s\n", vendor.Name)
		fmt.Fprintln(w, "         (if its handshake is fresh or its allocatable count is above zero).")
		if unhealthy > 0 {
			fmt.Fprintf(w, "Note: %d device(s) are unhealthy (a missing \"health\" key means unhealthy); HAMi will not place pods on them.\n", unhealthy)
		}
		return
	}
	fmt.Fprintln(w, "Verdict: the node does NOT register for "+vendor.Name)
	fmt.Fprintf(w, "Reason:  %v\n", v.Err)
	switch {
	case v.HAMiCrashes:
		fmt.Fprintln(w, "HAMi:    the scheduler extender panics on this value (nil pointer dereference) and restarts;")
		fmt.Fprintln(w, "         while the annotation stays, no node registers. Fix the writer or remove the annotation:")
		fmt.Fprintf(w, "         kubectl annotate node <node> %s-\n", vendor.RegisterKey)
	case v.HAMiLog != "":
		fmt.Fprintf(w, "HAMi logs (%s): %s\n", v.HAMiLogLevel, v.HAMiLog)
	}
	switch {
	case errors.Is(v.Err, annotation.ErrNoDevices):
		fmt.Fprintln(w, "Fix:     the device plugin found no GPU: check that the plugin pod sees the driver (nvidia-smi in the pod).")
	case errors.Is(v.Err, annotation.ErrMalformed):
		fmt.Fprintln(w, "Fix:     the value was written by an incompatible agent or edited by hand; restarting the device")
		fmt.Fprintln(w, "         plugin pod rewrites it. A pre-2.8 agent writes the legacy colon format, which HAMi ≥ 2.8 cannot read.")
	}
}

func printHandshake(w io.Writer, vendor annotation.Vendor, raw string, alloc int64, version handshake.Version) bool {
	fmt.Fprintln(w)
	key := vendor.HandshakeKey
	if key == "" {
		fmt.Fprintf(w, "Handshake: vendor %s has none.\n", vendor.Name)
		return true
	}
	now := time.Now()
	v := handshake.Parse(raw, raw != "", time.Local)
	if alloc < 0 {
		alloc = 0
		fmt.Fprintln(w, "(no --allocatable given: assuming 0)")
	}
	d := handshake.Decide(handshake.Input{Handshake: v, Allocatable: alloc, Now: now, Registered: true, Reported: alloc}, handshake.Options{Version: version})
	fmt.Fprintf(w, "Handshake %s = %q (%s)\n", key, raw, v.State)
	if v.TimeOK {
		fmt.Fprintf(w, "  stamped %s ago\n", now.Sub(v.Time).Round(time.Second))
	}
	fmt.Fprintf(w, "  allocatable %s = %s\n", orDash(vendor.ResourceName), strconv.FormatInt(alloc, 10))
	fmt.Fprintf(w, "  healthy: %v; %s\n", d.Healthy, d.Reason)
	if v.State == handshake.StateRequesting && d.Healthy && alloc > 0 {
		fmt.Fprintln(w, "  An old Requesting_ timestamp is normal: nobody refreshes it since HAMi 2.8; allocatable keeps the node registered.")
	}
	return d.Healthy
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
