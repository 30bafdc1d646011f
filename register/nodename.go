package register

import (
	"context"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
)

// Environment variables that carry the node name into the device plugin's container.
const (
	// EnvNodeName is the variable HAMi's chart sets from spec.nodeName (v2.3.10 and later).
	EnvNodeName = "NODE_NAME"
	// EnvLegacyNodeName is the variable charts older than v2.3.10 set instead.
	EnvLegacyNodeName = "NodeName"
)

// NodeNameFromEnv returns the name of the node the process runs on, read from [EnvNodeName],
// falling back to [EnvLegacyNodeName] with a logged warning. getenv looks variables up; nil
// means os.Getenv. Neither set (or both empty) is [ErrNoNodeName]; a name that is not a valid
// Node name is [ErrInvalidNodeName]. Unlike HAMi's agent, which starts anyway and fails every
// 5 s forever with "nodename is empty", the caller gets the error once, at start.
func NodeNameFromEnv(ctx context.Context, getenv func(string) string) (string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if name := strings.TrimSpace(getenv(EnvNodeName)); name != "" {
		return name, validateNodeName(name)
	}
	if name := strings.TrimSpace(getenv(EnvLegacyNodeName)); name != "" {
		klog.FromContext(ctx).Info("Warning: node name read from the legacy variable; set "+EnvNodeName+" from spec.nodeName instead",
			"variable", EnvLegacyNodeName, "node", name)
		return name, validateNodeName(name)
	}
	return "", fmt.Errorf("resolve node name: neither %s nor %s is set (set %s from the downward API field spec.nodeName): %w",
		EnvNodeName, EnvLegacyNodeName, EnvNodeName, ErrNoNodeName)
}

// validateNodeName checks that name can be a Node's name.
func validateNodeName(name string) error {
	if name == "" {
		return fmt.Errorf("validate node name: %w", ErrNoNodeName)
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return fmt.Errorf("validate node name %q: %s: %w", name, strings.Join(msgs, "; "), ErrInvalidNodeName)
	}
	return nil
}
