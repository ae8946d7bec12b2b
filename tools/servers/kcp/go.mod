module kbind.local/servers/kcp

go 1.25.0

require github.com/kcp-dev/kcp v0.31.2

replace (
	k8s.io/api => github.com/kcp-dev/kubernetes/staging/src/k8s.io/api v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/apiextensions-apiserver => github.com/kcp-dev/kubernetes/staging/src/k8s.io/apiextensions-apiserver v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/apimachinery => github.com/kcp-dev/kubernetes/staging/src/k8s.io/apimachinery v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/apiserver => github.com/kcp-dev/kubernetes/staging/src/k8s.io/apiserver v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/cli-runtime => github.com/kcp-dev/kubernetes/staging/src/k8s.io/cli-runtime v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/client-go => github.com/kcp-dev/kubernetes/staging/src/k8s.io/client-go v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/cloud-provider => github.com/kcp-dev/kubernetes/staging/src/k8s.io/cloud-provider v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.35.1 // fork pseudo-version not served by the proxy
	k8s.io/code-generator => github.com/kcp-dev/kubernetes/staging/src/k8s.io/code-generator v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/component-base => github.com/kcp-dev/kubernetes/staging/src/k8s.io/component-base v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/component-helpers => github.com/kcp-dev/kubernetes/staging/src/k8s.io/component-helpers v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/controller-manager => k8s.io/controller-manager v0.35.1 // fork pseudo-version not served by the proxy
	k8s.io/cri-api => github.com/kcp-dev/kubernetes/staging/src/k8s.io/cri-api v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/cri-client => github.com/kcp-dev/kubernetes/staging/src/k8s.io/cri-client v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.35.1 // fork pseudo-version not served by the proxy
	k8s.io/dynamic-resource-allocation => github.com/kcp-dev/kubernetes/staging/src/k8s.io/dynamic-resource-allocation v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/endpointslice => k8s.io/endpointslice v0.35.1 // fork pseudo-version not served by the proxy
	k8s.io/externaljwt => github.com/kcp-dev/kubernetes/staging/src/k8s.io/externaljwt v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kms => github.com/kcp-dev/kubernetes/staging/src/k8s.io/kms v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kube-aggregator => github.com/kcp-dev/kubernetes/staging/src/k8s.io/kube-aggregator v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kube-controller-manager => github.com/kcp-dev/kubernetes/staging/src/k8s.io/kube-controller-manager v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kube-proxy => github.com/kcp-dev/kubernetes/staging/src/k8s.io/kube-proxy v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kube-scheduler => github.com/kcp-dev/kubernetes/staging/src/k8s.io/kube-scheduler v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kubectl => github.com/kcp-dev/kubernetes/staging/src/k8s.io/kubectl v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kubelet => github.com/kcp-dev/kubernetes/staging/src/k8s.io/kubelet v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/kubernetes => github.com/kcp-dev/kubernetes v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/metrics => github.com/kcp-dev/kubernetes/staging/src/k8s.io/metrics v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/mount-utils => github.com/kcp-dev/kubernetes/staging/src/k8s.io/mount-utils v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/pod-security-admission => github.com/kcp-dev/kubernetes/staging/src/k8s.io/pod-security-admission v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/sample-apiserver => github.com/kcp-dev/kubernetes/staging/src/k8s.io/sample-apiserver v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/sample-cli-plugin => github.com/kcp-dev/kubernetes/staging/src/k8s.io/sample-cli-plugin v0.0.0-20260401063412-ba4f7d493d5b
	k8s.io/sample-controller => github.com/kcp-dev/kubernetes/staging/src/k8s.io/sample-controller v0.0.0-20260401063412-ba4f7d493d5b
)

// kcp's own staging modules (./staging/... in kcp's go.mod; absent from the module zip),
// mapped to the versions publishing-bot tagged for the same release.
replace (
	github.com/kcp-dev/apimachinery/v2 => github.com/kcp-dev/apimachinery/v2 v2.31.2
	github.com/kcp-dev/client-go => github.com/kcp-dev/client-go v0.31.2
	github.com/kcp-dev/code-generator/v3 => github.com/kcp-dev/code-generator/v3 v3.32.3 // v3.31.x not served; not linked into cmd/kcp
	github.com/kcp-dev/sdk => github.com/kcp-dev/sdk v0.31.2
	github.com/kcp-dev/virtual-workspace-framework => github.com/kcp-dev/virtual-workspace-framework v0.31.2
)
