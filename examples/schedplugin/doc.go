// Package schedplugin is the skeleton of a kube-scheduler framework plugin that places HAMi
// GPU pods with the SDK instead of an extender: PreFilter reads the pod's request
// (allocation.Requests), Filter fits it on each node's registered GPUs against what the
// exported usage tracker (package usage) says the pods hold there and against the namespace's
// ResourceQuota, Reserve fits again and assumes the choice in the tracker under one lock,
// Unreserve undoes it, and PreBind writes HAMi's filter annotations, which HAMi's device plugin
// (or a node agent of this SDK) then serves. The node lock of HAMi's bind (package nodelock)
// is left out of the skeleton.
//
// The tracker is fed by the plugin's owner from the scheduler's informers (see
// [Plugin.Handlers]). The skeleton compiles against k8s.io/kube-scheduler/framework only;
// registering it in a scheduler binary needs k8s.io/kubernetes (app.WithPlugin), which is why
// this example is a module of its own and the SDK's root module never requires it.
//
//	p, err := schedplugin.New(client, schedplugin.Options{})
//	if err != nil {
//		return err
//	}
//	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(p.PodHandler()); err != nil {
//		return err
//	}
//	if _, err := factory.Core().V1().ResourceQuotas().Informer().AddEventHandler(p.QuotaHandler()); err != nil {
//		return err
//	}
//	// app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, func(...) { return p, nil }))
package schedplugin
