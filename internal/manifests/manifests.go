// Package manifests reads the examples' deploy manifests for the tests that check them (the
// examples' unit tests and the e2e tests that create them on a real API server) and for
// examples/quickstart, which applies them. No library package imports it.
package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/yaml"
)

// Docs returns the non-empty YAML documents of file.
func Docs(file string) ([][]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			docs = append(docs, doc)
		}
	}
}

// Read decodes every object of the files with client-go's scheme, strictly: unknown kinds,
// unknown fields and duplicate fields fail.
func Read(files ...string) ([]runtime.Object, error) {
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for _, f := range files {
		docs, err := Docs(f)
		if err != nil {
			return nil, err
		}
		for _, doc := range docs {
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs, nil
}

// TB is the part of testing.TB that [Glob] uses. The package does not import testing, so that
// programs (examples/quickstart) link it without the testing package.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Glob is Read of the files that pattern matches; it fails tb (a testing.TB) when there are
// none or one does not decode.
func Glob(tb TB, pattern string) []runtime.Object {
	tb.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		tb.Fatalf("no manifests match %s: %v", pattern, err)
	}
	objs, err := Read(files...)
	if err != nil {
		tb.Fatal(err)
	}
	return objs
}

// Find returns the first object of type T named name, and false when there is none.
func Find[T interface {
	runtime.Object
	GetName() string
}](objs []runtime.Object, name string) (T, bool) {
	for _, o := range objs {
		if v, ok := o.(T); ok && v.GetName() == name {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// SchedulerConfig decodes, strictly, the KubeSchedulerConfiguration that the ConfigMap cm
// carries under config.yaml (examples/extender/deploy/scheduler-config.yaml's shape).
func SchedulerConfig(cm *corev1.ConfigMap) (*kubeschedulerconfigv1.KubeSchedulerConfiguration, error) {
	data, ok := cm.Data["config.yaml"]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s has no config.yaml", cm.Name)
	}
	cfg := &kubeschedulerconfigv1.KubeSchedulerConfiguration{}
	if err := yaml.UnmarshalStrict([]byte(data), cfg); err != nil {
		return nil, fmt.Errorf("ConfigMap %s config.yaml: %w", cm.Name, err)
	}
	return cfg, nil
}

// ExtenderOverHTTP points the configuration's only extender at url over plain HTTP, as a
// loopback test or the quickstart runs it (the file's is HTTPS on 127.0.0.1:443).
func ExtenderOverHTTP(cfg *kubeschedulerconfigv1.KubeSchedulerConfiguration, url string) error {
	if len(cfg.Extenders) != 1 {
		return fmt.Errorf("the KubeSchedulerConfiguration has %d extenders, want 1", len(cfg.Extenders))
	}
	x := &cfg.Extenders[0]
	x.URLPrefix, x.EnableHTTPS, x.TLSConfig = url, false, nil
	return nil
}
