package main

import (
	"encoding/json"
	"errors"
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

// Exit statuses of explain.
const (
	exitRegisters    = 0
	exitNotRegisters = 1
	exitUsage        = 2
)

const explainUsage = `Usage:
  {cmd} explain [flags] VALUE     explain a register annotation value
  {cmd} explain [flags] -f FILE   read the value from a file
  {cmd} explain [flags] -         read the value from standard input

It reads no cluster. Exit status: 0 when the node would register, 1 when it would not,
2 on usage errors.
`

// explainResult is explain's -o json and yaml form.
type explainResult struct {
	Vendor       string           `json:"vendor"`
	Key          string           `json:"key"`
	Registers    bool             `json:"registers"`
	Devices      json.RawMessage  `json:"devices,omitempty"` // in HAMi's register form
	Error        string           `json:"error,omitempty"`
	HAMiLog      string           `json:"hamiLog,omitempty"`
	HAMiLogLevel string           `json:"hamiLogLevel,omitempty"`
	HAMiCrashes  bool             `json:"hamiCrashes,omitempty"`
	Handshake    *handshakeResult `json:"handshake,omitempty"`
}

// handshakeResult is the handshake part of explainResult.
type handshakeResult struct {
	Key         string `json:"key"`
	Value       string `json:"value"`
	State       string `json:"state"`
	AgeSeconds  int64  `json:"ageSeconds,omitempty"`
	Allocatable int64  `json:"allocatable"`
	Healthy     bool   `json:"healthy"`
	Reason      string `json:"reason"`
}

func (c *cli) explain(args []string) int {
	fs, output := c.newFlags("explain", explainUsage)
	file := fs.StringP("file", "f", "", "read the annotation value from `FILE`")
	vendorName := fs.String("vendor", annotation.VendorNVIDIA, "HAMi vendor word whose annotation this is (NVIDIA, DCU, XPU, Vastai, biren, an Ascend or Iluvatar chip)")
	hs := fs.String("handshake", "", "also interpret this handshake annotation `VALUE` (hami.io/node-handshake)")
	alloc := fs.Int64("allocatable", -1, "allocatable count of the vendor's resource (e.g. nvidia.com/gpu), for --handshake")
	hamiVersion := fs.String("hami-version", "master", "HAMi semantics for --handshake: master or v2.9.0")
	if err := parse(fs, args); err != nil {
		return c.fail("explain", fs, err)
	}
	if err := checkOutput(*output); err != nil {
		return c.fail("explain", fs, err)
	}
	vendor, ok := annotation.VendorByName(*vendorName)
	if !ok {
		vendor, ok = vendorByChip(*vendorName)
	}
	if !ok {
		return c.fail("explain", fs, fmt.Errorf("%w: unknown vendor %q", errUsage, *vendorName))
	}
	version, err := parseHAMiVersion(*hamiVersion)
	if err != nil {
		return c.fail("explain", fs, err)
	}
	value, err := readValue(fs.Args(), *file, c.stdin)
	if err != nil {
		return c.fail("explain", fs, fmt.Errorf("%w: %w", errUsage, err))
	}
	verdict := annotation.Check(vendor, map[string]string{vendor.RegisterKey: value})
	res := explainResult{Vendor: vendor.Name, Key: vendor.RegisterKey, Registers: verdict.Registers,
		HAMiLog: verdict.HAMiLog, HAMiLogLevel: verdict.HAMiLogLevel, HAMiCrashes: verdict.HAMiCrashes}
	if verdict.Err != nil {
		res.Error = verdict.Err.Error()
	}
	if verdict.Registers {
		res.Devices = json.RawMessage(annotation.Encode(verdict.Devices))
	}
	registers := verdict.Registers
	if *hs != "" || *alloc >= 0 {
		res.Handshake = decideHandshake(vendor, *hs, *alloc, version, c.clock.Now())
		registers = registers && res.Handshake.Healthy
	}
	err = write(c.stdout, *output, document{kindExplanation, res}, func() {
		printVerdict(c.stdout, vendor, verdict)
		if res.Handshake != nil {
			printHandshake(c.stdout, vendor, res.Handshake, *alloc < 0)
		}
	})
	if err != nil {
		return c.fail("explain", nil, err)
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

// decideHandshake interprets a handshake value as HAMi's scheduler does at now; a negative
// alloc counts as 0.
func decideHandshake(vendor annotation.Vendor, raw string, alloc int64, version handshake.Version, now time.Time) *handshakeResult {
	key := vendor.HandshakeKey
	if key == "" {
		return &handshakeResult{Healthy: true, Reason: "vendor " + vendor.Name + " has no handshake"}
	}
	alloc = max(alloc, 0)
	v := handshake.Parse(raw, raw != "", time.Local)
	d := handshake.Decide(handshake.Input{Handshake: v, Allocatable: alloc, Now: now, Registered: true, Reported: alloc}, handshake.Options{Version: version})
	r := &handshakeResult{Key: key, Value: raw, State: fmt.Sprint(v.State), Allocatable: alloc, Healthy: d.Healthy, Reason: d.Reason}
	if v.TimeOK {
		r.AgeSeconds = int64(now.Sub(v.Time).Round(time.Second) / time.Second)
	}
	return r
}

func printHandshake(w io.Writer, vendor annotation.Vendor, h *handshakeResult, noAlloc bool) {
	fmt.Fprintln(w)
	if h.Key == "" {
		fmt.Fprintf(w, "Handshake: vendor %s has none.\n", vendor.Name)
		return
	}
	if noAlloc {
		fmt.Fprintln(w, "(no --allocatable given: assuming 0)")
	}
	fmt.Fprintf(w, "Handshake %s = %q (%s)\n", h.Key, h.Value, h.State)
	if h.AgeSeconds != 0 {
		fmt.Fprintf(w, "  stamped %v ago\n", time.Duration(h.AgeSeconds)*time.Second)
	}
	fmt.Fprintf(w, "  allocatable %s = %s\n", orDash(vendor.ResourceName), strconv.FormatInt(h.Allocatable, 10))
	fmt.Fprintf(w, "  healthy: %v; %s\n", h.Healthy, h.Reason)
	if h.State == handshake.StateRequesting.String() && h.Healthy && h.Allocatable > 0 {
		fmt.Fprintln(w, "  An old Requesting_ timestamp is normal: nobody refreshes it since HAMi 2.8; allocatable keeps the node registered.")
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
