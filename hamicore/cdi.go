package hamicore

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hamireg/hamireg/allocation"
)

// CDI names and keys of HAMi's and NVIDIA's device plugins, for the CDI device list
// strategies ([DeviceListCDIAnnotations], [DeviceListCDICRI]).
const (
	// DefaultCDIKind is the kind ("<vendor>/<class>") of the CDI devices a container is
	// given: HAMi's and NVIDIA's plugins name each GPU k8s.device-plugin.nvidia.com/gpu=<id>,
	// the ID being the GPU's UUID or, with [DeviceIDIndex], its NVML index. The CDI spec of
	// that kind must exist on the host (HAMi's plugin writes it at start-up; with this SDK,
	// nvidia-ctk cdi generate --vendor k8s.device-plugin.nvidia.com --class gpu writes it).
	DefaultCDIKind = "k8s.device-plugin.nvidia.com/gpu"
	// DefaultCDIAnnotationPrefix is the prefix of the CDI annotation key (the CDI project's
	// cdi.AnnotationPrefix, HAMi's --cdi-annotation-prefix default).
	DefaultCDIAnnotationPrefix = "cdi.k8s.io/"
	// CDIAnnotationPlugin is the plugin name in the CDI annotation key,
	// <prefix>nvidia-device-plugin_<response ID>, as HAMi's plugin writes it.
	CDIAnnotationPlugin = "nvidia-device-plugin"
)

// ErrInvalidOptions is wrapped by the errors of [EnvOptions.Validate] and
// [ParseDeviceListStrategies]: the options cannot work; the error names the valid values.
var ErrInvalidOptions = errors.New("invalid options")

// ErrCDIUnsupported is wrapped when a CDI device list strategy is asked where the SDK cannot
// name the devices as CDI devices: MIG devices (the MIG instances are created at Allocate,
// after the host's CDI spec was written, so the runtime could not resolve their names) and
// DRA claims (their own CDI spec carries the device list). The fix is envvar or
// volume-mounts there.
var ErrCDIUnsupported = errors.New("CDI device list strategies not supported")

// DeviceListStrategies is a set of device list strategies, as NVIDIA's and HAMi's
// --device-list-strategy take it: a comma-separated list of envvar, volume-mounts,
// cdi-annotations and cdi-cri. The zero value is none (which a container response reads as
// envvar, the default).
type DeviceListStrategies struct {
	EnvVar, VolumeMounts, CDIAnnotations, CDICRI bool
}

// deviceListNames are the strategies' names in [DeviceListStrategies.String]'s order.
func deviceListNames() []string {
	return []string{DeviceListEnvVar, DeviceListVolumeMounts, DeviceListCDIAnnotations, DeviceListCDICRI}
}

// ParseDeviceListStrategies reads a --device-list-strategy value: a comma-separated list of
// envvar, volume-mounts, cdi-annotations and cdi-cri (a strategy may repeat), or "" for
// envvar, the default. It refuses an unknown or empty element and envvar with volume-mounts,
// which both set NVIDIA_VISIBLE_DEVICES (NVIDIA's plugin lets volume-mounts win silently).
// Errors wrap [ErrInvalidOptions] and name the valid values.
func ParseDeviceListStrategies(s string) (DeviceListStrategies, error) {
	var out DeviceListStrategies
	if s == "" {
		out.EnvVar = true
		return out, nil
	}
	for _, e := range strings.Split(s, ",") {
		switch e {
		case DeviceListEnvVar:
			out.EnvVar = true
		case DeviceListVolumeMounts:
			out.VolumeMounts = true
		case DeviceListCDIAnnotations:
			out.CDIAnnotations = true
		case DeviceListCDICRI:
			out.CDICRI = true
		default:
			return DeviceListStrategies{}, fmt.Errorf("%w: device list strategy %q: %q is not one of %s (a comma-separated list)",
				ErrInvalidOptions, s, e, strings.Join(deviceListNames(), ", "))
		}
	}
	if out.EnvVar && out.VolumeMounts {
		return DeviceListStrategies{}, fmt.Errorf("%w: device list strategy %q: envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES: keep one of them",
			ErrInvalidOptions, s)
	}
	return out, nil
}

// String is the set as a --device-list-strategy value, in the order envvar, volume-mounts,
// cdi-annotations, cdi-cri; "" for none.
func (s DeviceListStrategies) String() string {
	var names []string
	for i, on := range []bool{s.EnvVar, s.VolumeMounts, s.CDIAnnotations, s.CDICRI} {
		if on {
			names = append(names, deviceListNames()[i])
		}
	}
	return strings.Join(names, ",")
}

// AnyCDI reports whether a CDI strategy is in the set.
func (s DeviceListStrategies) AnyCDI() bool { return s.CDIAnnotations || s.CDICRI }

// AllCDI reports whether the set has CDI strategies only: then the container gets no
// NVIDIA_VISIBLE_DEVICES (nor NVIDIA_GDS and NVIDIA_MOFED), as with HAMi's plugin.
func (s DeviceListStrategies) AllCDI() bool { return s.AnyCDI() && !s.EnvVar && !s.VolumeMounts }

// Validate checks the options a container response uses: the device list strategy
// ([ParseDeviceListStrategies]), the device ID strategy ("", uuid or index), CDIKind (a
// CDI kind "<vendor>/<class>") and CDIAnnotationPrefix (a DNS subdomain and '/'), and
// refuses GDRCopy with CDI strategies alone (NVIDIA_GDRCOPY would be dropped: NVIDIA's CDI
// spec has no gdrcopy device). Errors wrap [ErrInvalidOptions] and name the valid values.
// A component that takes EnvOptions calls it in its New.
func (o EnvOptions) Validate() error {
	s, err := ParseDeviceListStrategies(o.DeviceListStrategy)
	if err != nil {
		return err
	}
	switch o.DeviceIDStrategy {
	case "", DeviceIDUUID, DeviceIDIndex:
	default:
		return fmt.Errorf("%w: device ID strategy %q is not %s or %s", ErrInvalidOptions, o.DeviceIDStrategy, DeviceIDUUID, DeviceIDIndex)
	}
	if o.CDIKind != "" {
		if err := checkCDIKind(o.CDIKind); err != nil {
			return fmt.Errorf("%w: CDI kind %q: %w: want <vendor>/<class>, such as %s", ErrInvalidOptions, o.CDIKind, err, DefaultCDIKind)
		}
	}
	if p := o.CDIAnnotationPrefix; p != "" {
		host, ok := strings.CutSuffix(p, "/")
		if errs := validation.IsDNS1123Subdomain(host); !ok || len(errs) > 0 {
			return fmt.Errorf("%w: CDI annotation prefix %q is not a DNS subdomain followed by '/', such as %s", ErrInvalidOptions, p, DefaultCDIAnnotationPrefix)
		}
	}
	if o.GDRCopy && s.AllCDI() {
		return fmt.Errorf("%w: GDRCopy with device list strategy %q: NVIDIA_GDRCOPY is read by the NVIDIA runtime hook, which CDI strategies alone bypass: add envvar", ErrInvalidOptions, o.DeviceListStrategy)
	}
	return nil
}

// ParseCDIName splits a fully qualified CDI device name "<vendor>/<class>=<name>" and
// checks each part by the CDI specification's rules: vendor and class start with a letter,
// end with a letter or digit and hold only ASCII letters, digits, '_', '-' and '.'; the
// device name starts and ends with a letter or digit and may also hold ':'. The error says
// which rule a name breaks. It never panics.
func ParseCDIName(s string) (vendor, class, name string, err error) {
	kind, name, ok := strings.Cut(s, "=")
	if !ok || kind == "" || name == "" || s[0] == '/' {
		return "", "", "", fmt.Errorf("CDI device %q is not <vendor>/<class>=<name>", s)
	}
	if vendor, class, err = parseCDIKind(kind); err != nil {
		return "", "", "", fmt.Errorf("CDI device %q: %w", s, err)
	}
	if err := checkCDIPart("device name", name, isAlnum, ":"); err != nil {
		return "", "", "", fmt.Errorf("CDI device %q: %w", s, err)
	}
	return vendor, class, name, nil
}

// parseCDIKind splits "<vendor>/<class>" and checks both parts.
func parseCDIKind(kind string) (vendor, class string, err error) {
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok || vendor == "" || class == "" {
		return "", "", fmt.Errorf("kind %q is not <vendor>/<class>", kind)
	}
	if err := checkCDIPart("vendor", vendor, isLetter, ""); err != nil {
		return "", "", err
	}
	if err := checkCDIPart("class", class, isLetter, ""); err != nil {
		return "", "", err
	}
	return vendor, class, nil
}

// checkCDIKind checks a CDI kind.
func checkCDIKind(kind string) error {
	_, _, err := parseCDIKind(kind)
	return err
}

// checkCDIPart checks one part of a CDI name: non-empty, first byte accepted by first, last
// byte a letter or digit, the bytes between letters, digits, '_', '-', '.' or one of extra.
func checkCDIPart(what, s string, first func(byte) bool, extra string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty %s", what)
	case !first(s[0]):
		return fmt.Errorf("%s %q starts with %q", what, s, s[0])
	case !isAlnum(s[len(s)-1]):
		return fmt.Errorf("%s %q does not end with a letter or digit", what, s)
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !isAlnum(c) && !strings.ContainsRune("_-."+extra, rune(c)) {
			return fmt.Errorf("%s %q holds %q", what, s, c)
		}
	}
	return nil
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isAlnum(c byte) bool { return isLetter(c) || '0' <= c && c <= '9' }

// cdiEdits adds the CDI part of a device list to r: one CDI device <kind>=<id> per ID, plus
// <vendor>/gds=all and <vendor>/mofed=all with GDS and MOFED (NVIDIA's CDI specs of those
// modes), as the annotation <prefix>nvidia-device-plugin_<responseID> (cdi-annotations) and
// as Response.CDIDevices (cdi-cri).
func cdiEdits(r *allocation.Response, ids []string, s DeviceListStrategies, opts EnvOptions, responseID string) error {
	kind := cmp.Or(opts.CDIKind, DefaultCDIKind)
	vendor, _, err := parseCDIKind(kind)
	if err != nil {
		return fmt.Errorf("%w: CDI kind: %w", ErrInvalidOptions, err)
	}
	names := make([]string, 0, len(ids)+2)
	for _, id := range ids {
		name := kind + "=" + id
		if _, _, _, err := ParseCDIName(name); err != nil {
			return fmt.Errorf("device %q has no CDI device name: %w", id, err)
		}
		names = append(names, name)
	}
	if opts.GDS {
		names = append(names, vendor+"/gds=all")
	}
	if opts.MOFED {
		names = append(names, vendor+"/mofed=all")
	}
	if s.CDIAnnotations {
		key, err := cdiAnnotationKey(cmp.Or(opts.CDIAnnotationPrefix, DefaultCDIAnnotationPrefix), responseID)
		if err != nil {
			return err
		}
		r.Annotations = map[string]string{key: strings.Join(names, ",")}
	}
	if s.CDICRI {
		r.CDIDevices = names
	}
	return nil
}

// cdiAnnotationKey is <prefix>nvidia-device-plugin_<responseID> ('/' in the ID as '_'),
// checked as the CDI project's AnnotationKey checks it: at most 63 bytes after the prefix,
// letters, digits, '_', '-' and '.', a letter or digit at both ends.
func cdiAnnotationKey(prefix, responseID string) (string, error) {
	if responseID == "" {
		return "", errors.New("CDI annotation: no response ID (Container.ResponseID or CacheID)")
	}
	name := CDIAnnotationPlugin + "_" + strings.ReplaceAll(responseID, "/", "_")
	if len(name) > validation.LabelValueMaxLength {
		return "", fmt.Errorf("CDI annotation: key name %q is longer than %d bytes", name, validation.LabelValueMaxLength)
	}
	if err := checkCDIPart("CDI annotation key name", name, isAlnum, ""); err != nil {
		return "", fmt.Errorf("CDI annotation: %w", err)
	}
	return prefix + name, nil
}
