{{/* The install namespace (schema, resync, claims, issue). */}}
{{- define "kbind.namespace" -}}
{{ .Values.namespace.name }}
{{- end }}

{{/* relsync's own namespace. */}}
{{- define "kbind.relsyncNamespace" -}}
{{ .Values.passes.relsync.namespace.name }}
{{- end }}

{{/* issue's grants namespace (--grants-namespace). */}}
{{- define "kbind.grantsNamespace" -}}
{{ .Values.passes.issue.grantsNamespace.name }}
{{- end }}

{{/* The image: repository:tag, or repository:tag@digest when a digest is pinned. */}}
{{- define "kbind.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}:{{ $tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/* Labels of every object; call with (dict "root" $ "component" "<pass>"). */}}
{{- define "kbind.labels" -}}
app.kubernetes.io/name: kbind
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* The Pod Security labels of kbind's namespaces: its pods meet `restricted`. */}}
{{- define "kbind.podSecurityLabels" -}}
pod-security.kubernetes.io/enforce: restricted
pod-security.kubernetes.io/warn: restricted
pod-security.kubernetes.io/audit: restricted
{{- end }}

{{/*
A pass's CronJob: the chart's copy of jobs/<pass>/cronjob.yaml (charts/kbind/jobs/, kept
byte-identical to the repository's jobs/ by tests/install.rs; Helm reads only files inside the
chart), with the values applied on top. Call with
(dict "root" $ "pass" "<pass>" "namespace" "<ns>" "args" (list ...) "volumeMounts" (list) "volumes" (list)).

From the copy, as kustomize installs it: the name, concurrencyPolicy, the history limits,
podFailurePolicy, ttlSecondsAfterFinished, the ServiceAccount, restartPolicy, the pod and
container securityContext (not configurable: the namespaces enforce Pod Security `restricted`),
the container's name and its env (extraEnv is appended).

From the values and the call: the namespace, Helm's labels, schedule, suspend,
startingDeadlineSeconds, backoffLimit, activeDeadlineSeconds, image, imagePullPolicy, resources,
volumeMounts and volumes (none when the call gives none; with caBundle set, the bundle's
ConfigMap and SSL_CERT_FILE pointing at it), and the args: the pass, "lead"
(optional), --deadline, "args", --lease-namespace and the logging flags, "tail", extraArgs: the
order of the kustomize manifests.
*/}}
{{- define "kbind.cronjob" -}}
{{- $root := .root -}}
{{- $v := index $root.Values.passes .pass -}}
{{- $path := printf "jobs/%s/cronjob.yaml" .pass -}}
{{- $cron := $root.Files.Get $path | fromYaml -}}
{{- if or (hasKey $cron "Error") (ne (toString $cron.kind) "CronJob") -}}
{{- fail (printf "%s in the chart is not a CronJob (copy it from the repository's jobs/): %v" $path ($cron.Error | default "missing or empty")) -}}
{{- end -}}
{{- $labels := include "kbind.labels" (dict "root" $root "component" .pass) | fromYaml -}}
{{- $_ := set $cron.metadata "namespace" .namespace -}}
{{- $_ = set $cron.metadata "labels" $labels -}}
{{- $spec := $cron.spec -}}
{{- $_ = set $spec "schedule" $v.schedule -}}
{{- if $v.suspend -}}
{{- $_ = set $spec "suspend" true -}}
{{- else -}}
{{- $_ = unset $spec "suspend" -}}
{{- end -}}
{{- $_ = set $spec "startingDeadlineSeconds" $v.startingDeadlineSeconds -}}
{{- $_ = set $spec.jobTemplate "metadata" (dict "labels" $labels) -}}
{{- $job := $spec.jobTemplate.spec -}}
{{- $_ = set $job "backoffLimit" $v.backoffLimit -}}
{{- $_ = set $job "activeDeadlineSeconds" $v.activeDeadlineSeconds -}}
{{- $_ = set $job.template "metadata" (dict "labels" $labels) -}}
{{- $pod := $job.template.spec -}}
{{- $c := index $pod.containers 0 -}}
{{- $args := concat (list .pass) (.lead | default (list)) (list (printf "--deadline=%v" $v.deadline)) (.args | default (list)) (list (printf "--lease-namespace=%s" .namespace) (printf "--log-format=%v" $root.Values.logFormat)) -}}
{{- with $root.Values.logLevel -}}
{{- $args = append $args (printf "--log-level=%v" .) -}}
{{- end -}}
{{- with $root.Values.pushgatewayUrl -}}
{{- $args = append $args (printf "--pushgateway-url=%v" .) -}}
{{- end -}}
{{- $argStrings := list -}}
{{- range concat $args (.tail | default (list)) ($v.extraArgs | default (list)) -}}
{{- $argStrings = append $argStrings (toString .) -}}
{{- end -}}
{{- $_ = set $c "image" (include "kbind.image" $root) -}}
{{- $_ = set $c "imagePullPolicy" $root.Values.image.pullPolicy -}}
{{- $_ = set $c "args" $argStrings -}}
{{- $env := $c.env | default (list) -}}
{{- $mounts := .volumeMounts | default (list) -}}
{{- $volumes := .volumes | default (list) -}}
{{- if $root.Values.caBundle -}}
{{- $env = append $env (dict "name" "SSL_CERT_FILE" "value" "/etc/kbind/ca-bundle/ca-bundle.pem") -}}
{{- $mounts = append $mounts (dict "name" "ca-bundle" "mountPath" "/etc/kbind/ca-bundle" "readOnly" true) -}}
{{- $volumes = append $volumes (dict "name" "ca-bundle" "configMap" (dict "name" "kbind-ca-bundle")) -}}
{{- end -}}
{{- $_ = set $c "env" (concat $env ($v.extraEnv | default (list))) -}}
{{- $_ = set $c "resources" $v.resources -}}
{{- if $mounts -}}
{{- $_ = set $c "volumeMounts" $mounts -}}
{{- else -}}
{{- $_ = unset $c "volumeMounts" -}}
{{- end -}}
{{- if $volumes -}}
{{- $_ = set $pod "volumes" $volumes -}}
{{- else -}}
{{- $_ = unset $pod "volumes" -}}
{{- end -}}
# From {{ $path }} (a copy of the repository's jobs/{{ .pass }}/cronjob.yaml, whose comments say
# why each field is set), with the chart's values applied.
{{ toYaml $cron }}
{{- end }}

{{/* The Lease Role and RoleBinding of a pass in namespace ns: (dict "root" $ "pass" "<pass>" "namespace" "<ns>"). */}}
{{- define "kbind.leaseRole" -}}
# The pass Lease (one run at a time): `kbind-{{ .pass }}`, or `kbind-{{ .pass }}-<i>-of-<n>` with
# --shard. get, create when missing, update (take over an expired Lease and release it).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: kbind-{{ .pass }}-lease
  namespace: {{ .namespace }}
  labels:
    {{- include "kbind.labels" (dict "root" .root "component" .pass) | nindent 4 }}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "create", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: kbind-{{ .pass }}-lease
  namespace: {{ .namespace }}
  labels:
    {{- include "kbind.labels" (dict "root" .root "component" .pass) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: kbind-{{ .pass }}-lease
subjects:
  - kind: ServiceAccount
    name: kbind-{{ .pass }}
    namespace: {{ .namespace }}
{{- end }}

{{/* A pass's ServiceAccount and the ClusterRoleBinding of its ClusterRole kbind-<pass>. */}}
{{- define "kbind.identity" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kbind-{{ .pass }}
  namespace: {{ .namespace }}
  labels:
    {{- include "kbind.labels" (dict "root" .root "component" .pass) | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kbind-{{ .pass }}
  labels:
    {{- include "kbind.labels" (dict "root" .root "component" .pass) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kbind-{{ .pass }}
subjects:
  - kind: ServiceAccount
    name: kbind-{{ .pass }}
    namespace: {{ .namespace }}
{{- end }}

{{/* Connection Secrets for schema or resync: a Role in each credential namespace (the install
namespace and credentialNamespaces). (dict "root" $ "pass" "<pass>" "verbs" "<yaml list>"). */}}
{{- define "kbind.credentialRoles" -}}
{{- $root := .root -}}
{{- $pass := .pass -}}
{{- $verbs := .verbs -}}
{{- range $i, $ns := prepend $root.Values.credentialNamespaces (include "kbind.namespace" $root) | uniq }}
{{- if $i }}
---
{{- end }}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: kbind-{{ $pass }}-credentials
  namespace: {{ $ns }}
  labels:
    {{- include "kbind.labels" (dict "root" $root "component" $pass) | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: {{ $verbs }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: kbind-{{ $pass }}-credentials
  namespace: {{ $ns }}
  labels:
    {{- include "kbind.labels" (dict "root" $root "component" $pass) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: kbind-{{ $pass }}-credentials
subjects:
  - kind: ServiceAccount
    name: kbind-{{ $pass }}
    namespace: {{ include "kbind.namespace" $root }}
{{- end }}
{{- end }}

{{/* --credential-namespace for schema and resync, when namespaces besides the install one are set. */}}
{{- define "kbind.credentialArgs" -}}
{{- if .Values.credentialNamespaces -}}
{{ list (printf "--credential-namespace=%s" (prepend .Values.credentialNamespaces (include "kbind.namespace" .) | uniq | join ",")) | toJson }}
{{- else -}}
[]
{{- end -}}
{{- end }}
