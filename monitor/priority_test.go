package monitor

import (
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestSpecPriority(t *testing.T) {
	t.Parallel()
	env := func(v string) corev1.EnvVar { return corev1.EnvVar{Name: EnvTaskPriority, Value: v} }
	limit := func(s string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/priority": resource.MustParse(s)}}
	}
	tests := map[string]struct {
		c    corev1.Container
		want int32
	}{
		"nothing: HAMi-core's default":   {corev1.Container{}, 1},
		"limit 0":                        {corev1.Container{Resources: limit("0")}, 0},
		"limit 2":                        {corev1.Container{Resources: limit("2")}, 2},
		"limit wins over the variable":   {corev1.Container{Resources: limit("0"), Env: []corev1.EnvVar{env("5")}}, 0},
		"variable":                       {corev1.Container{Env: []corev1.EnvVar{env("0")}}, 0},
		"last definition wins":           {corev1.Container{Env: []corev1.EnvVar{env("0"), env("3")}}, 3},
		"variable read as atoi":          {corev1.Container{Env: []corev1.EnvVar{env(" 7x")}}, 7},
		"not a number is 0, as atoi":     {corev1.Container{Env: []corev1.EnvVar{env("high")}}, 0},
		"valueFrom is not resolved":      {corev1.Container{Env: []corev1.EnvVar{{Name: EnvTaskPriority, ValueFrom: &corev1.EnvVarSource{}}}}, 1},
		"other variables ignored":        {corev1.Container{Env: []corev1.EnvVar{{Name: "CUDA_TASK_PRIORITY_X", Value: "0"}}}, 1},
		"limit beyond int32 is cut":      {corev1.Container{Resources: limit("4294967296")}, 0},
		"milli limit rounds up as Value": {corev1.Container{Resources: limit("500m")}, 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := SpecPriority(&tc.c); got != tc.want {
				t.Errorf("SpecPriority = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestAtoi(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int32{
		"": 0, "0": 0, "1": 1, "-1": -1, "+4": 4, " \t\n12": 12, "12abc": 12, "abc": 0, "- 1": 0, "--1": 0,
		"2147483647": math.MaxInt32, "2147483648": math.MinInt32, "4294967297": 1,
		"9223372036854775807": -1, "99999999999999999999": -1, "-9223372036854775808": 0, "-99999999999999999999": 0,
	} {
		if got := atoi(in); got != want {
			t.Errorf("atoi(%q) = %d, want %d", in, got, want)
		}
	}
}

// refAtoi is (int)strtol(s, NULL, 10) with arbitrary precision.
func refAtoi(s string) int32 {
	i := 0
	for i < len(s) && strings.IndexByte(" \t\n\v\f\r", s[i]) >= 0 {
		i++
	}
	j := i
	if j < len(s) && (s[j] == '+' || s[j] == '-') {
		j++
	}
	k := j
	for k < len(s) && s[k] >= '0' && s[k] <= '9' {
		k++
	}
	if k == j {
		return 0
	}
	v, ok := new(big.Int).SetString(s[i:k], 10)
	if !ok {
		panic(fmt.Sprintf("reference cannot parse %q", s[i:k]))
	}
	switch {
	case v.Cmp(big.NewInt(math.MaxInt64)) > 0:
		v.SetInt64(math.MaxInt64)
	case v.Cmp(big.NewInt(math.MinInt64)) < 0:
		v.SetInt64(math.MinInt64)
	}
	return int32(v.Int64())
}

// FuzzAtoi: the reading of CUDA_TASK_PRIORITY never panics and is glibc's atoi.
func FuzzAtoi(f *testing.F) {
	for _, s := range []string{"", "1", "-0", " +12x", "9223372036854775808", "-9223372036854775809", "\v7", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := atoi(s), refAtoi(s); got != want {
			t.Fatalf("atoi(%q) = %d, want %d", s, got, want)
		}
	})
}
