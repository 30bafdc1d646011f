package harness

import (
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/dra"
)

// MIGRequestName and MIGShareRequestName are the sub-requests of [MIGFirstAvailableClaim]:
// its result's request is "<ClaimRequestName>/<sub-request>" ("gpu/mig" or "gpu/share").
const (
	MIGRequestName      = "mig"
	MIGShareRequestName = "share"
)

// MIGCreateDeviceClass creates dra.MIGDeviceClass(p) unless a class of that name exists (see
// [ControlPlane.CreateDeviceClass]).
func (cp *ControlPlane) MIGCreateDeviceClass(tb testing.TB, p dra.Profile) *resourcev1.DeviceClass {
	tb.Helper()
	classes := cp.AdminClient().ResourceV1().DeviceClasses()
	want := dra.MIGDeviceClass(p)
	c, err := classes.Create(tb.Context(), want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		c, err = classes.Get(tb.Context(), want.Name, metav1.GetOptions{})
	}
	if err != nil {
		tb.Fatalf("create DeviceClass %s: %v", want.Name, err)
	}
	return c
}

// MIGClaim is the ResourceClaim ns/name whose one request ([ClaimRequestName]) asks the MIG
// class of p for one MIG device of profile (dra.ProfileSelector), with further CEL selectors
// (e.g. on the parent GPU's UUID).
func MIGClaim(ns, name string, p dra.Profile, profile string, selectors ...string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: ClaimRequestName, Exactly: migRequest(p, profile, selectors),
		}}}},
	}
}

func migRequest(p dra.Profile, profile string, selectors []string) *resourcev1.ExactDeviceRequest {
	r := &resourcev1.ExactDeviceRequest{DeviceClassName: dra.MIGDeviceClass(p).Name, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}
	for _, cel := range append([]string{dra.ProfileSelector(p, profile)}, selectors...) {
		r.Selectors = append(r.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: cel}})
	}
	return r
}

// MIGFirstAvailableClaim is the ResourceClaim ns/name "a MIG device of profile, else a share
// of a GPU with memory": one request ([ClaimRequestName]) with two sub-requests in order of
// preference, [MIGRequestName] (the MIG class of p, the profile) and [MIGShareRequestName]
// (the GPU class of p, capacity memory).
func MIGFirstAvailableClaim(ns, name string, p dra.Profile, profile, memory string) *resourcev1.ResourceClaim {
	m := migRequest(p, profile, nil)
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: ClaimRequestName,
			FirstAvailable: []resourcev1.DeviceSubRequest{
				{Name: MIGRequestName, DeviceClassName: m.DeviceClassName, Selectors: m.Selectors, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1},
				{Name: MIGShareRequestName, DeviceClassName: dra.DeviceClass(p).Name, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
					Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory)}}},
			},
		}}}},
	}
}
