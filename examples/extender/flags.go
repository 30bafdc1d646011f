package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/nodelock"
)

// flags are HAMi's scheduler flags that this program reads, with HAMi's names and defaults.
type flags struct {
	httpBind, certFile, keyFile, kubeconfig     string
	clientCAFile                                string
	allowedClientNames                          []string
	trustedUsers, trustedGroups                 []string
	metricsBind                                 string
	legacyMetrics                               bool
	simulationLiveUsage                         bool
	extendedResourceMapping                     bool
	accounting                                  string
	schedulerName, leaseName, leaseNamespace    string
	nodePolicy, gpuPolicy                       string
	leaderElect, forceOverwriteDefaultScheduler bool
	nodeLockTimeout, nodeLockWait               time.Duration
	kubeQPS                                     float32
	kubeBurst                                   int
	nodeSelector                                map[string]string
	defaultMem, defaultCores, defaultGPU        int32
	// vendorName and its resources choose the vendor scheduled (default NVIDIA).
	vendorName, vendorResource, vendorMemory, vendorCores string
}

func newFlags(fs *pflag.FlagSet) *flags {
	f := &flags{}
	fs.StringVar(&f.httpBind, "http_bind", "127.0.0.1:8080", "address the extender and the webhook listen on")
	fs.StringVar(&f.metricsBind, "metrics-bind-address", extender.DefaultMetricsBindAddress, "address /metrics (HAMi's scheduler metrics and the SDK's own) listens on; empty serves none")
	fs.BoolVar(&f.legacyMetrics, "legacy-metrics", false, "also serve HAMi's legacy metric names (GPUDeviceMemoryLimit, nodeGPUOverview, vGPUMemoryAllocated, QuotaUsed, …) beside the current ones")
	fs.StringVar(&f.certFile, "cert_file", "", "TLS certificate (HTTPS, as the webhook needs); empty serves plain HTTP")
	fs.StringVar(&f.keyFile, "key_file", "", "TLS private key")
	fs.StringVar(&f.clientCAFile, "client_ca_file", "", "CA bundle (PEM) that clients' certificates must chain to: with it, /filter, /bind and /webhook accept only clients presenting such a certificate (kube-scheduler's extender tlsConfig, the API server's webhook client certificate), refused at the TLS handshake otherwise; needs --cert_file; the probes are then served on --metrics-bind-address")
	fs.StringSliceVar(&f.allowedClientNames, "allowed_client_names", nil, "common names a client certificate may have (comma-separated, e.g. kube-scheduler's and the API server's); empty: any certificate of --client_ca_file")
	fs.StringSliceVar(&f.trustedUsers, "trusted_users", extender.DefaultTrustedUsers, "users (admission userInfo.username) the webhook lets change a pod's allocation annotations: the scheduler's and the node agent's ServiceAccounts; empty (--trusted_users=): none")
	fs.StringSliceVar(&f.trustedGroups, "trusted_groups", extender.DefaultTrustedGroups, "groups whose members the webhook lets change a pod's allocation annotations; empty (--trusted_groups=): none")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster")
	fs.StringVar(&f.schedulerName, "scheduler-name", extender.DefaultSchedulerName, "scheduler name the webhook gives GPU pods")
	fs.BoolVar(&f.forceOverwriteDefaultScheduler, "force-overwrite-default-scheduler", true, "the webhook overwrites schedulerName default-scheduler")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "write handshakes only while kube-scheduler in this pod holds its Lease")
	fs.StringVar(&f.leaseName, "leader-elect-resource-name", extender.DefaultSchedulerName, "name of kube-scheduler's Lease")
	fs.StringVar(&f.leaseNamespace, "leader-elect-resource-namespace", "kube-system", "namespace of kube-scheduler's Lease")
	fs.StringVar(&f.nodePolicy, "node-scheduler-policy", string(allocation.PolicyBinpack), "node policy: binpack or spread")
	fs.StringVar(&f.gpuPolicy, "gpu-scheduler-policy", string(allocation.PolicySpread), "GPU policy: binpack, spread or topology-aware")
	fs.DurationVar(&f.nodeLockTimeout, "node-lock-timeout", nodelock.DefaultTimeout, "age after which a node lock is taken over")
	fs.DurationVar(&f.nodeLockWait, "node-lock-retry-timeout", extender.DefaultNodeLockWait, "how long a bind waits for another pod's node lock (negative: fail at once, as HAMi v2.9.0)")
	fs.Float32Var(&f.kubeQPS, "kube-qps", 200, "client QPS to the API server: a GPU pod costs 4 writes (filter annotations, node lock, bind-phase, binding), so 200 keeps pace with kube-scheduler's own 50 (client-go's 5, HAMi's default, makes every filter and bind wait); Events have a client of their own")
	fs.IntVar(&f.kubeBurst, "kube-burst", 400, "client burst to the API server")
	fs.StringToStringVar(&f.nodeSelector, "node-label-selector", nil, "key=value pairs separated by commas: the nodes that may register")
	fs.Int32Var(&f.defaultMem, "default-mem", 0, "MiB given to a container that asks for no memory (0: the whole GPU)")
	fs.Int32Var(&f.defaultCores, "default-cores", 0, "core percentage of a container that asks for none")
	fs.StringVar(&f.accounting, "accounting", "", "how init containers and native sidecars count on a GPU: kubernetes (Kubernetes' rule, KEP-753) or hami (HAMi's own, for a cluster whose GPUs HAMi's scheduler shares); empty: kubernetes")
	fs.BoolVar(&f.extendedResourceMapping, "extended-resource-mapping", true, "read the DeviceClasses (resource.k8s.io/v1, Kubernetes 1.34 and later) for the extended-resource mapping: where a class's extendedResourceName is the GPU count resource, nodes whose allocatable has none of it serve it through DRA, and whole-GPU pods are left to kube-scheduler there; false for a cluster without resource.k8s.io/v1 (readiness would wait for the DeviceClasses)")
	fs.BoolVar(&f.simulationLiveUsage, "simulation-live-usage", false, "a Cluster Autoscaler's /filter with whole Nodes fits a Node that is a registered live node (same name and UID) against what its pods hold (default: every request Node empty, as HAMi v2.10.0)")
	fs.Int32Var(&f.defaultGPU, "default-gpu", 1, "GPU count the webhook adds to a container that asks for memory or cores only")
	fs.StringVar(&f.vendorName, "vendor", annotation.VendorNVIDIA, "vendor word of the devices scheduled; a vendor other than NVIDIA gets the generic fit and its keys from annotation.NewVendor (register hami.io/node-<vendor>-register, pod keys hami.io/<vendor>-devices-to-allocate and -allocated); HAMi's own vendors (Ascend, MLU, DCU, …) are refused: HAMi's scheduler fits them")
	fs.StringVar(&f.vendorResource, "vendor-resource-name", "", "extended resource a pod asks the --vendor's devices with (needed for a vendor other than NVIDIA)")
	fs.StringVar(&f.vendorMemory, "vendor-memory-resource-name", "", "resource a pod asks the --vendor's device memory (MiB) with; empty: none, a device is whole")
	fs.StringVar(&f.vendorCores, "vendor-core-resource-name", "", "resource a pod asks the --vendor's device cores (percent) with; empty: none")
	return f
}

// vendor is the vendor the flags name.
func (f *flags) vendor() annotation.Vendor {
	if f.vendorName == "" || f.vendorName == annotation.VendorNVIDIA {
		return annotation.NVIDIA()
	}
	if v, ok := annotation.VendorByName(f.vendorName); ok {
		return v // refused by the extender with the reason (HAMi's own rules)
	}
	v := annotation.NewVendor(f.vendorName, f.vendorResource)
	v.ResourceMemoryName, v.ResourceCoreName = f.vendorMemory, f.vendorCores
	return v
}

func (f *flags) config() allocation.Config {
	return allocation.Config{NodeSchedulerPolicy: allocation.Policy(f.nodePolicy), GPUSchedulerPolicy: allocation.Policy(f.gpuPolicy),
		DefaultMemory: f.defaultMem, DefaultCores: f.defaultCores, DefaultGPUNum: f.defaultGPU, Accounting: allocation.Accounting(f.accounting)}
}

func (f *flags) selector() labels.Selector {
	if len(f.nodeSelector) == 0 {
		return nil
	}
	return labels.SelectorFromSet(f.nodeSelector)
}

// identity is kube-scheduler's identity in this pod before "_<uuid>": the host name.
func identity() (string, error) {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "", fmt.Errorf("host name for the leader identity: %q, %w", h, err)
	}
	return h, nil
}

// clients returns the client of the extender's requests and one for its Events, with a rate
// limiter of its own (as kube-scheduler has), so that Events never delay a filter or a bind.
func (f *flags) clients() (client, events kubernetes.Interface, err error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.QPS, cfg.Burst = f.kubeQPS, f.kubeBurst
	if client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, nil, err
	}
	if events, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, nil, err
	}
	return client, events, nil
}
