package annotation

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// vendorTable renders the vendor table of docs/device-plugins.md from [Vendors].
func vendorTable() string {
	var b strings.Builder
	b.WriteString("| vendor word | kubelet resource | register annotation | format | handshake | node agent (`nodeagent.New`) | scheduled by |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	orDash := func(s string) string {
		if s == "" {
			return "—"
		}
		return "`" + s + "`"
	}
	for _, v := range Vendors() {
		agent := "yes"
		switch {
		case v.Validate(PartNodeAgent) != nil && v.RegisterKey == "":
			agent = "no: capacity vendor, no register annotation"
		case v.Validate(PartNodeAgent) != nil:
			agent = "no: its " + v.Format.String() + " format is HAMi's vendor plugin's own"
		case v.Validate(PartAllocate) != nil:
			agent = "yes (Allocate without pod annotations)"
		}
		sched := "HAMi's scheduler"
		if v.Name == VendorNVIDIA {
			sched = "this SDK's extender or HAMi's scheduler"
		}
		name := v.Name
		if v.MasterOnly {
			name += " (master)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", name, orDash(v.ResourceName), orDash(v.RegisterKey), v.Format, orDash(v.HandshakeKey), agent, sched)
	}
	return b.String()
}

// The vendor table of docs/device-plugins.md is the table of [Vendors]; run with HAMIREG_UPDATE_README=1 to
// rewrite it.
func TestREADMEVendorTable(t *testing.T) {
	t.Parallel()
	const path = "../docs/device-plugins.md"
	const begin, end = "<!-- vendor table: begin -->\n", "<!-- vendor table: end -->"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("docs/device-plugins.md has no %q … %q block", strings.TrimSpace(begin), end)
	}
	want := vendorTable()
	if got := s[i+len(begin) : j]; got != want {
		if os.Getenv("HAMIREG_UPDATE_README") != "" {
			if err := os.WriteFile(path, []byte(s[:i+len(begin)]+want+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("docs/device-plugins.md's vendor table differs from annotation.Vendors(); rerun with HAMIREG_UPDATE_README=1:\n%s", want)
	}
}
