package monitor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
)

// A region that stays broken is counted by its class in hamireg_monitor_regions at every
// scrape (it is not adopted and has no series), and counted ok again once it is rewritten.
func TestBrokenRegionStaysCounted(t *testing.T) {
	t.Parallel()
	b := newFolderBed(t, Options{})
	b.setPods(nil, testPod("trainer-0", uidA, []string{"main"}), testPod("trainer-1", uidB, []string{"main"}))
	good := b.folder(ContainersDir+"/"+uidA+"_main", time.Hour)
	writeTestRegion(t, filepath.Join(good, "a.cache"), 1, 1, 1<<30)
	bad := b.folder(ContainersDir+"/"+uidB+"_main", time.Hour)
	path := filepath.Join(bad, "b.cache")
	writeTestRegion(t, path, 1, 1, 1<<30)
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := b.m.Register(reg); err != nil {
		t.Fatal(err)
	}
	want := func(ok, unknown int) string {
		return strings.NewReplacer("OK", strconv.Itoa(ok), "UNK", strconv.Itoa(unknown)).Replace(`# HELP hamireg_monitor_regions Regions the scrape found, by state: ok (read) or the class of the read error.
# TYPE hamireg_monitor_regions gauge
hamireg_monitor_regions{state="error",zone="vGPU"} 0
hamireg_monitor_regions{state="invalid",zone="vGPU"} 0
hamireg_monitor_regions{state="not_initialized",zone="vGPU"} 0
hamireg_monitor_regions{state="ok",zone="vGPU"} OK
hamireg_monitor_regions{state="too_small",zone="vGPU"} 0
hamireg_monitor_regions{state="truncated",zone="vGPU"} 0
hamireg_monitor_regions{state="unknown_layout",zone="vGPU"} UNK
`)
	}
	for range 3 {
		b.scan()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want(1, 1)), "hamireg_monitor_regions"); err != nil {
			t.Fatal(err)
		}
	}
	writeTestRegion(t, path, 1, 1, 1<<30)
	b.scan()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(2, 0)), "hamireg_monitor_regions"); err != nil {
		t.Fatal(err)
	}
}

// With a DRA world (Options.Claims) a node without a containers folder is scanned all the
// same: its claim folders are read and the monitor is ready. Without one, HAMi's rule holds:
// the scan fails (TestListerConformance's containers_folder_missing).
func TestMissingContainersFolderWithClaims(t *testing.T) {
	t.Parallel()
	const claimUID = "c1a1a1a1-0000-4000-8000-000000000001"
	b := newFolderBed(t, Options{Claims: claimsMap{claimUID: {Namespace: "team-a", Name: "gpu"}}})
	if err := os.Remove(filepath.Join(b.root, ContainersDir)); err != nil {
		t.Fatal(err)
	}
	gen := "gpu"
	p := testPod("trainer-0", uidA, []string{"main"})
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &gen}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	b.setPods(nil, p)
	dir := b.folder(ClaimsDir+"/"+claimUID, time.Hour)
	writeTestRegion(t, filepath.Join(dir, claimUID+".cache"), 1, 1, 1<<30)
	b.scan()
	if got := b.keys(); len(got) != 1 || !strings.HasPrefix(got[0], "claims/"+claimUID+" team-a/trainer-0 main") {
		t.Fatalf("containers %v, want the claim's", got)
	}
	if err := b.m.Ready(); err != nil {
		t.Fatalf("Ready = %v", err)
	}
}
