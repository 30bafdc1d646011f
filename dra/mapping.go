package dra

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ErrInvalidClass is wrapped when a DeviceClass cannot be written as asked (an
// extendedResourceName that is not an extended resource name).
var ErrInvalidClass = errors.New("invalid DeviceClass")

// DeviceClassOptions shape [DeviceClassWith]. The zero value is [DeviceClass]'s class.
type DeviceClassOptions struct {
	// ExtendedResourceName is written as the class's spec.extendedResourceName
	// (extended-resource mapping, KEP-5004, GA and on in Kubernetes 1.37): a pod that asks
	// this resource, e.g. nvidia.com/gpu: 1, gets it through a claim of the class that
	// kube-scheduler writes itself, on every node whose allocatable of the name is 0 or
	// absent ([ServedThroughDRA]); elsewhere the device plugin serves it as before. Each unit
	// of the resource is one device: with the profiles' request-policy defaults one whole GPU
	// (all of its memory; cores and shares as the profile's defaults). Empty: no mapping.
	// Give the name to one class only: where several classes map it, kube-scheduler uses the
	// newest.
	ExtendedResourceName corev1.ResourceName
}

// DeviceClassWith is [DeviceClass] with the options: with ExtendedResourceName the class
// carries spec.extendedResourceName. It fails, wrapping [ErrInvalidClass], for a name that is
// not an extended resource name (a domain-prefixed name outside kubernetes.io, such as
// nvidia.com/gpu), which the API server would refuse.
func DeviceClassWith(p Profile, opts DeviceClassOptions) (*resourcev1.DeviceClass, error) {
	c := DeviceClass(p)
	if opts.ExtendedResourceName == "" {
		return c, nil
	}
	if err := validExtendedResourceName(opts.ExtendedResourceName); err != nil {
		return nil, fmt.Errorf("write DeviceClass %s: extendedResourceName %q: %w: %w", c.Name, opts.ExtendedResourceName, err, ErrInvalidClass)
	}
	name := string(opts.ExtendedResourceName)
	c.Spec.ExtendedResourceName = &name
	return c, nil
}

// validExtendedResourceName checks what the API server checks of a DeviceClass's
// extendedResourceName (an extended resource name): domain-prefixed, not in kubernetes.io's
// domain, not starting with the quotas' "requests.", and a qualified name with it.
func validExtendedResourceName(name corev1.ResourceName) error {
	s := string(name)
	switch {
	case !strings.Contains(s, "/"):
		return errors.New("not domain-prefixed (e.g. nvidia.com/gpu)")
	case strings.Contains(s, corev1.ResourceDefaultNamespacePrefix):
		return errors.New("in the kubernetes.io domain, which is not for extended resources")
	case strings.HasPrefix(s, corev1.DefaultResourceRequestsPrefix):
		return fmt.Errorf("starts with %q", corev1.DefaultResourceRequestsPrefix)
	}
	if errs := validation.IsQualifiedName(corev1.DefaultResourceRequestsPrefix + s); len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// MappingClass returns the DeviceClass of classes through which kube-scheduler serves the
// extended resource name, nil when none does: the class whose spec.extendedResourceName is
// name (of several, the newest, ties broken by the smaller name, as kube-scheduler's
// extended-resource cache chooses), or, for a name deviceclass.resource.kubernetes.io/<class>,
// the class <class> (every class's implicit name). Nil entries are skipped.
func MappingClass(name corev1.ResourceName, classes []*resourcev1.DeviceClass) *resourcev1.DeviceClass {
	if class, ok := strings.CutPrefix(string(name), resourcev1.ResourceDeviceClassPrefix); ok {
		for _, c := range classes {
			if c != nil && c.Name == class {
				return c
			}
		}
		return nil
	}
	var found *resourcev1.DeviceClass
	for _, c := range classes {
		if c == nil || c.Spec.ExtendedResourceName == nil || corev1.ResourceName(*c.Spec.ExtendedResourceName) != name {
			continue
		}
		if found == nil || newer(c, found) {
			found = c
		}
	}
	return found
}

// newer reports whether a wins over b in kube-scheduler's choice among classes mapping the
// same name: the later creation, then the smaller name.
func newer(a, b *resourcev1.DeviceClass) bool {
	ta, tb := a.CreationTimestamp.UnixNano(), b.CreationTimestamp.UnixNano()
	if ta != tb {
		return ta > tb
	}
	return a.Name < b.Name
}

// ServedThroughDRA reports whether a node whose status.allocatable is allocatable serves the
// extended resource name through DRA, kube-scheduler's rule (its DynamicResources plugin,
// KEP-5004): a DeviceClass maps the name ([MappingClass]) and the node's allocatable of it
// is 0 or absent. Otherwise the device plugin serves it (NodeResourcesFit and, for HAMi's
// resources, the extender). A node is one or the other for a name: the node agent counts a
// DRA-owned GPU nowhere in the kubelet's count, so a node whose GPUs are all DRA's has 0
// and is a DRA node, and one GPU left to the device plugin makes it a device-plugin node for
// the name, whose DRA GPUs then serve explicit claims only.
func ServedThroughDRA(name corev1.ResourceName, allocatable corev1.ResourceList, classes []*resourcev1.DeviceClass) bool {
	if MappingClass(name, classes) == nil {
		return false
	}
	q, ok := allocatable[name]
	return !ok || q.IsZero()
}
