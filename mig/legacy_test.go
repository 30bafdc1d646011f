package mig

import (
	"errors"
	"testing"
)

func TestParseLegacyUUID(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		uuid               string
		gpu                string
		template, position int
		suffixed, wantErr  bool
	}{
		"plain":         {uuid: testGPU, gpu: testGPU},
		"suffixed":      {uuid: testGPU + "[0-1]", gpu: testGPU, position: 1, suffixed: true},
		"two digits":    {uuid: "GPU-a[12-34]", gpu: "GPU-a", template: 12, position: 34, suffixed: true},
		"leading zeros": {uuid: "GPU-a[01-002]", gpu: "GPU-a", template: 1, position: 2, suffixed: true},
		"bound":         {uuid: "GPU-a[65536-65536]", gpu: "GPU-a", template: 65536, position: 65536, suffixed: true},
		"empty":         {uuid: "", wantErr: true},
		"no close":      {uuid: "GPU-a[0-1", wantErr: true},
		"text after":    {uuid: "GPU-a[0-1]x", wantErr: true},
		"close only":    {uuid: "GPU-a]", wantErr: true},
		"no dash":       {uuid: "GPU-a[1]", wantErr: true},
		"negative":      {uuid: "GPU-a[-1-2]", wantErr: true},
		"three parts":   {uuid: "GPU-a[1-2-3]", wantErr: true},
		"letters":       {uuid: "GPU-a[a-b]", wantErr: true},
		"empty numbers": {uuid: "GPU-a[-]", wantErr: true},
		"plus sign":     {uuid: "GPU-a[+1-2]", wantErr: true},
		"above bound":   {uuid: "GPU-a[0-65537]", wantErr: true},
		"overflow":      {uuid: "GPU-a[0-99999999999999999999999]", wantErr: true},
		"no gpu":        {uuid: "[0-1]", wantErr: true},
		"nested":        {uuid: "GPU-a[[0-1]]", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			gpu, tmpl, pos, suffixed, err := ParseLegacyUUID(tt.uuid)
			if tt.wantErr {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("ParseLegacyUUID(%q) error = %v, want ErrMalformed", tt.uuid, err)
				}
				return
			}
			if err != nil || gpu != tt.gpu || tmpl != tt.template || pos != tt.position || suffixed != tt.suffixed {
				t.Fatalf("ParseLegacyUUID(%q) = %q, %d, %d, %v, %v; want %q, %d, %d, %v", tt.uuid, gpu, tmpl, pos, suffixed, err,
					tt.gpu, tt.template, tt.position, tt.suffixed)
			}
			if suffixed {
				if got := FormatLegacyUUID(gpu, tmpl, pos); got != tt.uuid && name != "leading zeros" {
					t.Errorf("FormatLegacyUUID = %q, want %q", got, tt.uuid)
				}
			}
		})
	}
}

func FuzzParseLegacyUUID(f *testing.F) {
	for _, s := range []string{"", testGPU, testGPU + "[0-1]", "GPU-a[0-9]", "GPU-a[1]", "GPU-a[-1-2]", "[0-0]", "GPU-a[0-99999999999999999999]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uuid string) {
		gpu, tmpl, pos, suffixed, err := ParseLegacyUUID(uuid)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseLegacyUUID(%q) error %v is not ErrMalformed", uuid, err)
			}
			return
		}
		if !suffixed {
			if gpu != uuid {
				t.Fatalf("ParseLegacyUUID(%q) = %q unsuffixed", uuid, gpu)
			}
			return
		}
		if tmpl < 0 || pos < 0 || tmpl > maxLegacyIndex || pos > maxLegacyIndex {
			t.Fatalf("ParseLegacyUUID(%q) = %d, %d out of bounds", uuid, tmpl, pos)
		}
		g2, t2, p2, s2, err := ParseLegacyUUID(FormatLegacyUUID(gpu, tmpl, pos))
		if err != nil || g2 != gpu || t2 != tmpl || p2 != pos || !s2 {
			t.Fatalf("round trip of %q: %q, %d, %d, %v, %v", uuid, g2, t2, p2, s2, err)
		}
	})
}
