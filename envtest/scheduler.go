package envtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/envtest/proc"
)

// SchedulerOptions configures [ControlPlane.StartScheduler]. The zero value runs
// kube-scheduler with its default profile.
type SchedulerOptions struct {
	// Config is the KubeSchedulerConfiguration to run, e.g. with Extenders or extra
	// Profiles. StartScheduler copies it and sets apiVersion/kind, the client connection (a
	// kubeconfig for the user system:kube-scheduler, whose permissions come from the
	// apiserver's bootstrap RBAC policy) and, unless set, LeaderElection.LeaderElect=false.
	// Default: nil, an empty configuration (upstream defaults).
	Config *kubeschedulerconfigv1.KubeSchedulerConfiguration
	// Flags are appended to the control plane's kube-scheduler flags. Default: none.
	Flags []string
	// Hostname, when set, runs kube-scheduler with this host name (see [WithHostname]), which
	// is the first part of its leader-election identity "<Hostname>_<uuid>", as the pod name
	// is in a cluster. Default: the machine's host name.
	Hostname string
	// Binary is the path of a kube-scheduler-compatible program to run instead of
	// kube-scheduler, e.g. one built with app.NewSchedulerCommand(app.WithPlugin(…)) from
	// k8s.io/kubernetes/cmd/kube-scheduler/app (the hamireg repository's examples/scheduler):
	// it must take kube-scheduler's flags (--config, --secure-port, --cert-dir, …) and serve
	// /readyz as kube-scheduler does. Default: "", the kube-scheduler found in the folders
	// Start searched.
	Binary string
}

// Scheduler is a kube-scheduler process started by [ControlPlane.StartScheduler].
type Scheduler struct {
	p      *proc.Process
	dir    string
	port   int
	config string
}

// StartScheduler starts kube-scheduler against the control plane's apiserver and returns
// when its /readyz answers ok. ControlPlane.Stop stops it if the caller has not.
//
// Without [SchedulerOptions.Binary] it needs kube-scheduler, searched in the folders Start
// searched (setup-envtest's folder has none: see [BinaryNotFoundError] for where to get it).
func (cp *ControlPlane) StartScheduler(ctx context.Context, opts SchedulerOptions) (*Scheduler, error) {
	bin, err := cp.schedulerBinary(opts.Binary)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cp.opts.StartTimeout,
		fmt.Errorf("kube-scheduler not ready within %v", cp.opts.StartTimeout))
	defer cancel()

	dir, err := os.MkdirTemp(cp.dir, "scheduler-")
	if err != nil {
		return nil, fmt.Errorf("create scheduler dir: %w", err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.writeKubeconfig(kubeconfig, cp.pki.schedulerToken); err != nil {
		return nil, err
	}
	cfg := &kubeschedulerconfigv1.KubeSchedulerConfiguration{}
	if opts.Config != nil {
		cfg = opts.Config.DeepCopy()
	}
	cfg.TypeMeta = metav1.TypeMeta{APIVersion: kubeschedulerconfigv1.SchemeGroupVersion.String(), Kind: "KubeSchedulerConfiguration"}
	cfg.ClientConnection.Kubeconfig = kubeconfig
	if cfg.LeaderElection.LeaderElect == nil {
		cfg.LeaderElection.LeaderElect = new(false)
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("marshal scheduler config: %w", err)
	}
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, data, 0o600); err != nil {
		return nil, fmt.Errorf("write scheduler config: %w", err)
	}
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--config=" + configPath,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--v=2",
	}
	po := proc.Options{
		Name:    binScheduler,
		Path:    bin,
		Args:    append(args, opts.Flags...),
		LogPath: filepath.Join(dir, "kube-scheduler.log"),
	}
	if opts.Hostname != "" {
		if po, err = WithHostname(po, opts.Hostname); err != nil {
			return nil, err
		}
	}
	p, err := cp.spawn(po)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{p: p, dir: dir, port: ports[0], config: configPath}
	cp.mu.Lock()
	cp.schedulers = append(cp.schedulers, s)
	cp.mu.Unlock()

	// The scheduler serves a self-signed certificate from --cert-dir.
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, // self-signed, loopback only
	}}
	defer hc.CloseIdleConnections()
	start := time.Now()
	if err := p.WaitUntil(ctx, 50*time.Millisecond, Readyz(hc, fmt.Sprintf("https://127.0.0.1:%d/readyz", s.port), "")); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	cp.opts.Logf("kube-scheduler ready in %v (config %s)", time.Since(start).Round(time.Millisecond), configPath)
	return s, nil
}

// schedulerBinary is the program StartScheduler runs: binary when set (it must be an
// executable file), else the kube-scheduler of the control plane's folders.
func (cp *ControlPlane) schedulerBinary(binary string) (string, error) {
	if binary == "" {
		bins, err := findBinaries(cp.folders, "StartScheduler", binScheduler)
		if err != nil {
			return "", err
		}
		return bins[binScheduler], nil
	}
	fi, err := os.Stat(binary)
	if err != nil {
		return "", fmt.Errorf("scheduler binary: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("scheduler binary %s: not an executable file", binary)
	}
	return binary, nil
}

// Stop stops kube-scheduler (SIGTERM, SIGKILL after 10 s). It is safe to call more than once.
func (s *Scheduler) Stop() error { return s.p.Stop(10 * time.Second) }

// Pid is kube-scheduler's process id.
func (s *Scheduler) Pid() int { return s.p.Pid() }

// LogPath is kube-scheduler's log file.
func (s *Scheduler) LogPath() string { return s.p.LogPath() }

// ConfigPath is the KubeSchedulerConfiguration file the scheduler runs with.
func (s *Scheduler) ConfigPath() string { return s.config }

// LogTail returns the last n lines of the scheduler's log, for failure messages.
func (s *Scheduler) LogTail(n int) string { return s.p.LogTail(n) }
