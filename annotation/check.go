package annotation

import (
	"errors"
	"fmt"
)

// Verdict is what HAMi's scheduler concludes from one vendor's annotations on a Node: whether
// the devices decode (so the node can enter its cache, subject to the handshake), and if not,
// which failure and the exact message HAMi logs for it.
type Verdict struct {
	// Vendor is the vendor word, Key its register annotation key.
	Vendor, Key string
	// Registers is true when HAMi's scheduler accepts the device list.
	Registers bool
	// Devices is the decoded list when Registers is true.
	Devices []Device
	// Err is nil when Registers is true, else a classified error: errors.Is it with
	// [ErrAbsent], [ErrMalformed], [ErrNoDevices], [ErrInvalidElement] or [ErrUnsupported].
	Err error
	// HAMiLog is the message HAMi's scheduler logs for this outcome, verbatim, so operators can
	// grep for it ("failed to decode node devices", "no nvidia gpu device found",
	// "Failed to get node devices", "failed to decode pair scores"); empty when it registers or
	// when HAMi crashes.
	HAMiLog string
	// HAMiLogLevel is the level of HAMiLog: "error", "info" or "V(5)".
	HAMiLogLevel string
	// HAMiCrashes is true when HAMi's scheduler would panic on this input (a null element):
	// the whole extender restarts, every node is affected.
	HAMiCrashes bool
}

// ErrUnsupported is returned by [Check] for vendors whose register annotation this package does
// not decode (a vendor-specific format, or capacity-based vendors without one).
var ErrUnsupported = errors.New("vendor format not decoded by this package")

// Check reads vendor v's register annotation from a Node's annotations and says what HAMi's
// scheduler concludes, in HAMi's order: absent, undecodable, empty, a null element (where HAMi
// crashes), then for NVIDIA an undecodable topology score annotation. It never panics; a nil
// map is a node without annotations.
func Check(v Vendor, annotations map[string]string) Verdict {
	out := Verdict{Vendor: v.Name, Key: v.RegisterKey}
	switch v.Format {
	case FormatJSON, FormatLegacy:
	case FormatVendorSpecific, FormatCapacity:
		out.Err = fmt.Errorf("check %s (%s format): %w", v.Name, v.Format, ErrUnsupported)
		return out
	}
	value, ok := annotations[v.RegisterKey]
	if !ok {
		out.Err = &DecodeError{Key: v.RegisterKey, Kind: ErrAbsent, Offset: -1, Element: -1,
			Msg: "annos not found " + v.RegisterKey}
		out.HAMiLog, out.HAMiLogLevel = "Failed to get node devices", "V(5)"
		return out
	}
	var devs []Device
	var err error
	if v.Format == FormatLegacy {
		devs, err = DecodeLegacy(value)
	} else {
		devs, err = Decode(value)
	}
	var de *DecodeError
	if errors.As(err, &de) {
		de.Key = v.RegisterKey
	}
	switch {
	case errors.Is(err, ErrMalformed):
		out.Err = err
		out.HAMiLog, out.HAMiLogLevel = "failed to decode node devices", "error"
		return out
	case len(devs) == 0 && err == nil:
		out.Err = &DecodeError{Key: v.RegisterKey, Kind: ErrNoDevices, Offset: -1, Element: -1,
			Msg: "no gpu found on node"}
		if v.Name == VendorNVIDIA {
			out.HAMiLog = "no nvidia gpu device found"
		} else {
			out.HAMiLog = "no " + v.Name + " device found"
		}
		out.HAMiLogLevel = "info"
		return out
	case errors.Is(err, ErrInvalidElement):
		out.Err = err
		out.HAMiCrashes = true
		return out
	case err != nil:
		out.Err = err
		return out
	}
	if v.ScoreKey != "" {
		if score, ok := annotations[v.ScoreKey]; ok {
			if err := validatePairScores(score); err != nil {
				var de *DecodeError
				if errors.As(err, &de) {
					de.Key = v.ScoreKey
				}
				out.Err = err
				out.HAMiLog, out.HAMiLogLevel = "failed to decode pair scores", "error"
				return out
			}
		}
	}
	if v.ForceDevcore100 {
		for i := range devs {
			devs[i].Devcore = 100
		}
	}
	out.Registers = true
	out.Devices = devs
	return out
}
