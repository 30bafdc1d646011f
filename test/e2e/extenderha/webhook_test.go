package extenderha_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/extender"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// Resource names of HAMi's NVIDIA requests.
const (
	resGPU      = "nvidia.com/gpu"
	resMem      = "nvidia.com/gpumem"
	resMemPct   = "nvidia.com/gpumem-percentage"
	resCores    = "nvidia.com/gpucores"
	resPriority = "nvidia.com/priority"
	// ignoreLabel is the label whose value "ignore" keeps a namespace or pod from the webhook.
	ignoreLabel = "hami.io/webhook"
)

// webhookConfiguration is deploy/webhook.yaml for this test cluster: the extender at url
// instead of the Service hami-scheduler, caBundle the test's CA, a unique name, and the
// namespaceSelector narrowed to the test's namespaces (label harness.TestLabel=test) so that
// the other tests' pods on the shared control plane are not sent to this extender. Rules,
// failurePolicy, sideEffects, timeout, review versions, reinvocation and the object selector
// are the file's.
func webhookConfiguration(tb testing.TB, test, url string, caPEM []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	tb.Helper()
	wh := manifest[*admissionregistrationv1.MutatingWebhookConfiguration](tb, "webhook.yaml", "hami-webhook").DeepCopy()
	wh.Name = test
	if len(wh.Webhooks) != 1 || wh.Webhooks[0].ClientConfig.Service == nil || wh.Webhooks[0].ClientConfig.Service.Path == nil ||
		*wh.Webhooks[0].ClientConfig.Service.Path != extender.PathWebhook || wh.Webhooks[0].NamespaceSelector == nil {
		tb.Fatalf("deploy/webhook.yaml: want one webhook on the Service path %s with a namespaceSelector: %+v", extender.PathWebhook, wh.Webhooks)
	}
	w := &wh.Webhooks[0]
	u := url + *w.ClientConfig.Service.Path
	w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: caPEM}
	w.NamespaceSelector.MatchExpressions = append(w.NamespaceSelector.MatchExpressions,
		metav1.LabelSelectorRequirement{Key: harness.TestLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{test}})
	return wh
}

// container is what a test sees of one container after admission.
type container struct {
	Limits, Requests map[string]string
	Env              map[string]string
}

// admitted is what a test sees of a pod after admission.
type admitted struct {
	SchedulerName string
	Containers    []container
}

func seen(p *corev1.Pod) admitted {
	a := admitted{SchedulerName: p.Spec.SchedulerName}
	list := func(r corev1.ResourceList) map[string]string {
		if len(r) == 0 {
			return nil
		}
		m := map[string]string{}
		for k, v := range r {
			m[string(k)] = v.String()
		}
		return m
	}
	for _, c := range p.Spec.Containers {
		var env map[string]string
		for _, e := range c.Env {
			if env == nil {
				env = map[string]string{}
			}
			env[e.Name] = e.Value
		}
		a.Containers = append(a.Containers, container{Limits: list(c.Resources.Limits), Requests: list(c.Resources.Requests), Env: env})
	}
	return a
}

// limits builds a ResourceList from name, value pairs.
func limits(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

// same is what a container with these limits looks like after admission: requests
// defaulted from limits by the API server.
func same(kv ...string) container {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		q := resource.MustParse(kv[i+1])
		m[kv[i]] = q.String()
	}
	return container{Limits: m, Requests: m}
}

// The API server calls the extender's /webhook over TLS (verified with the caBundle) as
// deploy/webhook.yaml configures it, and pods come back as spec §3 says: GPU pods get the
// scheduler name and HAMi's defaults (nvidia.com/gpu 1 for memory or cores only,
// nvidia.com/gpucores 100 for whole GPUs, CUDA_TASK_PRIORITY), everything else is untouched,
// and a GPU pod with a node, or a pod without containers, is denied.
func TestWebhookOverTLS(t *testing.T) {
	t.Parallel()
	test := harness.UniqueName("webhook")
	ns, ignoredNS := test, test+"-ignored"
	createNamespace(t, ns, map[string]string{harness.TestLabel: test})
	createNamespace(t, ignoredNS, map[string]string{harness.TestLabel: test, ignoreLabel: "ignore"})
	cert := newServingCert(t)
	port := harness.FreePort(t)
	// The extender registers no node: its selector matches none, so it writes no handshake on
	// the other tests' nodes.
	ext := startExtender(t, "extender", "", port, cert, extenderArgs(t, map[string]string{
		"http_bind": "127.0.0.1:" + strconv.Itoa(port), "cert_file": cert.certFile, "key_file": cert.keyFile,
		"kubeconfig": extenderKubeconfig(t, ns), "leader-elect": "false", "node-label-selector": harness.TestLabel + "=" + test,
	}))

	wh := webhookConfiguration(t, test, ext.url, cert.caPEM)
	hooks := cp.AdminClient().AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := hooks.Create(t.Context(), wh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hooks.Delete(context.WithoutCancel(t.Context()), wh.Name, metav1.DeleteOptions{}) })

	pod := func(name string, containers ...corev1.ResourceList) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			// No node carries this selector: kube-scheduler never places these pods.
			Spec: corev1.PodSpec{NodeSelector: map[string]string{harness.TestLabel: test}}}
		for i, l := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c" + strconv.Itoa(i), Image: "registry.invalid/never-pulled:0",
				Resources: corev1.ResourceRequirements{Limits: l}})
		}
		return p
	}
	// The configuration takes effect once the API server's informer has it: wait until a
	// dry-run create (which calls webhooks with sideEffects None) comes back mutated.
	took := harness.Eventually(t, "the API server calls the webhook", 30*time.Second, func() bool {
		p, err := cp.AdminClient().CoreV1().Pods(ns).Create(t.Context(), pod("probe", limits(resGPU, "1")),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("dry-run create: %v", err)
		}
		return p.Spec.SchedulerName == extender.DefaultSchedulerName
	})
	t.Logf("webhook active %v after its configuration was created", took.Round(time.Millisecond))

	// The API server verifies the extender's certificate with the caBundle: with another CA
	// the call fails and, failurePolicy Ignore, the pod is admitted as it was.
	t.Run("untrusted CA: failing open", func(t *testing.T) {
		badNS := test + "-badca"
		createNamespace(t, badNS, map[string]string{harness.TestLabel: badNS})
		bad := webhookConfiguration(t, badNS, ext.url, newServingCert(t).caPEM)
		bad.Webhooks[0].Name = badNS + "." + bad.Webhooks[0].Name // unique in the API server's log
		if _, err := hooks.Create(t.Context(), bad, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hooks.Delete(context.WithoutCancel(t.Context()), bad.Name, metav1.DeleteOptions{}) })
		var p *corev1.Pod
		harness.Eventually(t, "the API server's failed call", 30*time.Second, func() bool {
			var err error
			p, err = cp.AdminClient().CoreV1().Pods(badNS).Create(t.Context(), pod("probe", limits(resGPU, "1")),
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil {
				t.Fatalf("dry-run create: %v", err)
			}
			return len(grepLog(t, cp.LogPath("kube-apiserver"), "failing open", bad.Webhooks[0].Name, "certificate signed by unknown authority")) > 0
		})
		if diff := cmp.Diff(admitted{SchedulerName: corev1.DefaultSchedulerName, Containers: []container{same(resGPU, "1")}}, seen(p)); diff != "" {
			t.Errorf("pod admitted through an untrusted webhook (-want +got):\n%s", diff)
		}
	})

	mutated := func(cs ...container) admitted {
		return admitted{SchedulerName: extender.DefaultSchedulerName, Containers: cs}
	}
	untouched := func(cs ...container) admitted {
		return admitted{SchedulerName: corev1.DefaultSchedulerName, Containers: cs}
	}
	withEnv := func(c container, kv ...string) container {
		c.Env = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			c.Env[kv[i]] = kv[i+1]
		}
		return c
	}
	cases := map[string]struct {
		pod     *corev1.Pod
		ns      string
		edit    func(*corev1.Pod)
		want    admitted
		wantErr string
	}{
		"gpu: whole GPU gets gpucores 100": {
			pod:  pod("gpu", limits(resGPU, "1")),
			want: mutated(same(resGPU, "1", resCores, "100")),
		},
		"gpumem: gets one GPU": {
			pod:  pod("gpumem", limits(resMem, "3000")),
			want: mutated(same(resMem, "3000", resGPU, "1")),
		},
		"gpu and gpumem: only the scheduler name": {
			pod:  pod("gpu-gpumem", limits(resGPU, "2", resMem, "3000")),
			want: mutated(same(resGPU, "2", resMem, "3000")),
		},
		"gpumem-percentage 100: a whole GPU": {
			pod:  pod("pct100", limits(resGPU, "2", resMemPct, "100")),
			want: mutated(same(resGPU, "2", resMemPct, "100", resCores, "100")),
		},
		"gpumem and gpumem-percentage 100: the percentage decides, a whole GPU": {
			pod:  pod("mem-pct100", limits(resGPU, "1", resMem, "3000", resMemPct, "100")),
			want: mutated(same(resGPU, "1", resMem, "3000", resMemPct, "100", resCores, "100")),
		},
		"gpu and gpumem-percentage 50: no cores": {
			pod:  pod("gpu-pct50", limits(resGPU, "1", resMemPct, "50")),
			want: mutated(same(resGPU, "1", resMemPct, "50")),
		},
		"gpumem-percentage 50: one GPU, no cores": {
			pod:  pod("pct50", limits(resMemPct, "50")),
			want: mutated(same(resMemPct, "50", resGPU, "1")),
		},
		"gpucores only: one GPU": {
			pod:  pod("cores", limits(resCores, "30")),
			want: mutated(same(resCores, "30", resGPU, "1")),
		},
		"gpu and gpucores: kept": {
			pod:  pod("gpu-cores", limits(resGPU, "1", resCores, "30")),
			want: mutated(same(resGPU, "1", resCores, "30")),
		},
		"priority: CUDA_TASK_PRIORITY": {
			pod:  pod("priority", limits(resGPU, "1", resPriority, "1")),
			want: mutated(withEnv(same(resGPU, "1", resPriority, "1", resCores, "100"), extender.EnvTaskPriority, "1")),
		},
		"second container asks, first untouched": {
			pod:  pod("two", limits(corev1.ResourceCPU.String(), "100m"), limits(resGPU, "1")),
			want: mutated(same(corev1.ResourceCPU.String(), "100m"), same(resGPU, "1", resCores, "100")),
		},
		"default-scheduler named explicitly: overwritten": {
			pod:  pod("default-named", limits(resGPU, "1")),
			edit: func(p *corev1.Pod) { p.Spec.SchedulerName = corev1.DefaultSchedulerName },
			want: mutated(same(resGPU, "1", resCores, "100")),
		},
		"hami-scheduler named already: defaults applied": {
			pod:  pod("hami-named", limits(resGPU, "1")),
			edit: func(p *corev1.Pod) { p.Spec.SchedulerName = extender.DefaultSchedulerName },
			want: mutated(same(resGPU, "1", resCores, "100")),
		},
		"no GPU: untouched": {
			pod:  pod("cpu", limits(corev1.ResourceCPU.String(), "100m")),
			want: untouched(same(corev1.ResourceCPU.String(), "100m")),
		},
		"no resources: untouched": {
			pod:  pod("nothing", nil),
			want: untouched(container{}),
		},
		"another scheduler: untouched": {
			pod:  pod("other", limits(resGPU, "1")),
			edit: func(p *corev1.Pod) { p.Spec.SchedulerName = "volcano" },
			want: admitted{SchedulerName: "volcano", Containers: []container{same(resGPU, "1")}},
		},
		"privileged container: skipped": {
			pod: pod("privileged", limits(resGPU, "1")),
			edit: func(p *corev1.Pod) {
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: new(true)}
			},
			want: untouched(same(resGPU, "1")),
		},
		"GPU in an init container only: untouched": {
			pod: pod("init", nil),
			edit: func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "registry.invalid/never-pulled:0",
					Resources: corev1.ResourceRequirements{Limits: limits(resGPU, "1")}}}
			},
			want: untouched(container{}),
		},
		"pod labelled hami.io/webhook=ignore: not sent": {
			pod:  pod("ignored-pod", limits(resGPU, "1")),
			edit: func(p *corev1.Pod) { p.Labels = map[string]string{ignoreLabel: "ignore"} },
			want: untouched(same(resGPU, "1")),
		},
		"namespace labelled hami.io/webhook=ignore: not sent": {
			pod:  pod("ignored-ns", limits(resGPU, "1")),
			ns:   ignoredNS,
			want: untouched(same(resGPU, "1")),
		},
		"GPU pod with a node: denied": {
			pod:     pod("assigned", limits(resGPU, "1")),
			edit:    func(p *corev1.Pod) { p.Spec.NodeName = test + "-node" },
			wantErr: "pod has node assigned",
		},
		"no containers: denied": {
			pod:     pod("empty"),
			wantErr: "pod has no containers",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := tc.pod
			if tc.edit != nil {
				tc.edit(p)
			}
			target := ns
			if tc.ns != "" {
				target = tc.ns
			}
			got, err := cp.AdminClient().CoreV1().Pods(target).Create(t.Context(), p, metav1.CreateOptions{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("create = %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, seen(got)); diff != "" {
				t.Errorf("admitted pod (-want +got):\n%s", diff)
			}
		})
	}
}
