package diagnose

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
)

// ClusterRoleRules returns the read-only RBAC rules Node and Nodes need for a complete report:
// get and list nodes; list pods and get their previous logs (the plugin's crash output);
// get the device plugin DaemonSet, the scheduler Deployment and its Lease; list
// RuntimeClasses; create SubjectAccessReviews (whether the plugin may patch nodes). Without
// one of them the report says what it could not check (a NotChecked finding); only the rule
// on nodes is indispensable.
//
// As a manifest, for a doctor running in the cluster:
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: ClusterRole
//	metadata:
//	  name: hami-doctor
//	rules:
//	- apiGroups: [""]
//	  resources: [nodes]
//	  verbs: [get, list]
//	- apiGroups: [""]
//	  resources: [pods]
//	  verbs: [list]
//	- apiGroups: [""]
//	  resources: [pods/log]
//	  verbs: [get]
//	- apiGroups: [apps]
//	  resources: [daemonsets, deployments]
//	  verbs: [get]
//	- apiGroups: [coordination.k8s.io]
//	  resources: [leases]
//	  verbs: [get]
//	- apiGroups: [node.k8s.io]
//	  resources: [runtimeclasses]
//	  verbs: [list]
//	- apiGroups: [authorization.k8s.io]
//	  resources: [subjectaccessreviews]
//	  verbs: [create]
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets", "deployments"}, Verbs: []string{"get"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get"}},
		{APIGroups: []string{"node.k8s.io"}, Resources: []string{"runtimeclasses"}, Verbs: []string{"list"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
}

// PodClusterRoleRules returns the read-only RBAC rules Pod and Pods need for a complete
// report, besides [ClusterRoleRules] (which covers the node diagnoses a pod report hands over
// to): get and list pods in every namespace (the pod, and the pods that hold GPUs and node
// locks), list events (the pod's scheduling and admission Events), get namespaces (the
// webhook's namespaceSelector), list resourcequotas (the GPU quota of the pod's namespace),
// list mutatingwebhookconfigurations and endpointslices (HAMi's webhook and whether its
// Service has endpoints), get configmaps (the KubeSchedulerConfiguration) and get pods/proxy
// (a Running pod's GPU usage, from the node monitor's /metrics on the device plugin Pod),
// and get and list, in resource.k8s.io, resourceclaims, resourceclaimtemplates,
// resourceslices, deviceclasses and devicetaintrules (a pod whose GPU comes from a claim).
// Nothing here writes, and Secrets are never read; pods/proxy is only used for GET
// /metrics. Without one of them the report says what it could not
// check (a NotChecked finding); only get pods is indispensable.
func PodClusterRoleRules() []rbacv1.PolicyRule {
	return append(ClusterRoleRules(),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events", "resourcequotas"}, Verbs: []string{"list"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces", "configmaps"}, Verbs: []string{"get"}},
		rbacv1.PolicyRule{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, Verbs: []string{"list"}},
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/proxy"}, Verbs: []string{"get"}},
		rbacv1.PolicyRule{APIGroups: []string{resourcev1.GroupName}, Resources: slices.Clone(draResources), Verbs: []string{"get", "list"}},
	)
}
