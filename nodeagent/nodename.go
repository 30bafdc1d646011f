package nodeagent

import (
	"context"

	"github.com/hamireg/hamireg/register"
)

// NodeNameFromEnv returns the name of the node a node program runs on, for [New]: the
// downward API's NODE_NAME, as HAMi's chart sets it from spec.nodeName, else the legacy
// NodeName with a logged warning (see [register.NodeNameFromEnv], which it is). getenv nil
// means os.Getenv. The errors are register's [register.ErrNoNodeName] and
// [register.ErrInvalidNodeName], whose messages name the DaemonSet field to set.
func NodeNameFromEnv(ctx context.Context, getenv func(string) string) (string, error) {
	return register.NodeNameFromEnv(ctx, getenv)
}
