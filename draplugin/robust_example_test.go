package draplugin_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/dra"
	"github.com/hamireg/hamireg/draplugin"
)

// The robustness knobs and what an operator reads back (the snippets of docs/dra.md's
// "Robustness guarantees"). It needs the kubelet's folders, so it only builds the plugin.
func ExamplePlugin_Cleanup() {
	build := func(client kubernetes.Interface, nodeName string, alert func(error)) (*draplugin.Plugin, error) {
		// snippet: README
		p, err := draplugin.New(draplugin.Options{
			Profile:          dra.SDKProfile(),
			Client:           client,
			NodeName:         nodeName,
			StaleClaimPeriod: 30 * time.Second, // default 1 min; negative: never
			OnError: func(ctx context.Context, err error, msg string) {
				if errors.Is(err, draplugin.ErrCheckpointCorrupt) {
					alert(err) // moved aside and rebuilt from the CDI specs: the error says where and what
				}
			},
		})
		if errors.Is(err, draplugin.ErrCheckpoint) {
			return nil, err // another driver's or a newer plugin's checkpoint, or an unreadable folder
		}
		// end snippet
		return p, err
	}
	_, err := build(fake.NewClientset(), "node-a", func(error) {})
	fmt.Println(err)
	// Output: <nil>
}

// A claim made for one pod is owned by it: created after the pod, it goes with the pod.
func Example_claimOwnedByPod() {
	create := func(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, claim *resourcev1.ResourceClaim) error {
		// snippet: README
		pod, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}) // names the claim
		if err != nil {
			return err
		}
		if err := dra.SetPodOwner(claim, pod); err != nil { // controller, blockOwnerDeletion
			return err
		}
		_, err = client.ResourceV1().ResourceClaims(pod.Namespace).Create(ctx, claim, metav1.CreateOptions{})
		// end snippet
		return err
	}
	_ = create
}
