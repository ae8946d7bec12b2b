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
A pass's CronJob, as in jobs/<pass>/cronjob.yaml. Call with
(dict "root" $ "pass" "<pass>" "namespace" "<ns>" "args" (list ...) "volumeMounts" (list) "volumes" (list)).
The args: the pass, "lead" (optional), --deadline, "args", --lease-namespace and the logging
flags, "tail", extraArgs: the order of the kustomize manifests.
*/}}
{{- define "kbind.cronjob" -}}
{{- $root := .root -}}
{{- $v := index $root.Values.passes .pass -}}
apiVersion: batch/v1
kind: CronJob
metadata:
  name: kbind-{{ .pass }}
  namespace: {{ .namespace }}
  labels:
    {{- include "kbind.labels" (dict "root" $root "component" .pass) | nindent 4 }}
spec:
  schedule: {{ $v.schedule | quote }}
  {{- if $v.suspend }}
  suspend: true
  {{- end }}
  # Never two runs at once (the pass Lease would make the second one skip anyway).
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: {{ $v.startingDeadlineSeconds }}
  successfulJobsHistoryLimit: 3
  failedJobsHistoryLimit: 3
  jobTemplate:
    metadata:
      labels:
        {{- include "kbind.labels" (dict "root" $root "component" .pass) | nindent 8 }}
    spec:
      backoffLimit: {{ $v.backoffLimit }}
      # Exit code 2 is a configuration error: fail the Job at once instead of retrying; an
      # evicted or preempted pod does not count against backoffLimit (docs/operations.md,
      # "Exit codes"). podFailurePolicy needs restartPolicy: Never.
      podFailurePolicy:
        rules:
          - action: FailJob
            onExitCodes:
              containerName: kbind
              operator: In
              values: [2]
          - action: Ignore
            onPodConditions:
              - type: DisruptionTarget
      # A little above --deadline: near the deadline the pass stops taking work and records
      # where it stopped; this only kills a run that hangs past it.
      activeDeadlineSeconds: {{ $v.activeDeadlineSeconds }}
      ttlSecondsAfterFinished: 3600
      template:
        metadata:
          labels:
            {{- include "kbind.labels" (dict "root" $root "component" .pass) | nindent 12 }}
        spec:
          serviceAccountName: kbind-{{ .pass }}
          restartPolicy: Never
          securityContext:
            runAsNonRoot: true
            runAsUser: 65532
            runAsGroup: 65532
            seccompProfile:
              type: RuntimeDefault
          containers:
            - name: kbind
              image: {{ include "kbind.image" $root | quote }}
              imagePullPolicy: {{ $root.Values.image.pullPolicy }}
              args:
                - {{ .pass }}
                {{- range .lead }}
                - {{ . | quote }}
                {{- end }}
                - --deadline={{ $v.deadline }}
                {{- range .args }}
                - {{ . | quote }}
                {{- end }}
                - --lease-namespace={{ .namespace }}
                - --log-format={{ $root.Values.logFormat }}
                {{- with $root.Values.logLevel }}
                - --log-level={{ . }}
                {{- end }}
                {{- with $root.Values.pushgatewayUrl }}
                - --pushgateway-url={{ . }}
                {{- end }}
                {{- range .tail }}
                - {{ . | quote }}
                {{- end }}
                {{- range $v.extraArgs }}
                - {{ . | quote }}
                {{- end }}
              env:
                # The Lease's holder identity and default namespace.
                - name: POD_NAMESPACE
                  valueFrom:
                    fieldRef:
                      fieldPath: metadata.namespace
                - name: POD_NAME
                  valueFrom:
                    fieldRef:
                      fieldPath: metadata.name
                # A pod the Job retries after a crash takes over its predecessor's Lease
                # (docs/operations.md, "The pass Lease").
                - name: JOB_NAME
                  valueFrom:
                    fieldRef:
                      fieldPath: metadata.labels['batch.kubernetes.io/job-name']
                {{- with $v.extraEnv }}
                {{- toYaml . | nindent 16 }}
                {{- end }}
              {{- with .volumeMounts }}
              volumeMounts:
                {{- toYaml . | nindent 16 }}
              {{- end }}
              resources:
                {{- toYaml $v.resources | nindent 16 }}
              securityContext:
                allowPrivilegeEscalation: false
                readOnlyRootFilesystem: true
                runAsNonRoot: true
                runAsUser: 65532
                capabilities:
                  drop: ["ALL"]
                seccompProfile:
                  type: RuntimeDefault
          {{- with .volumes }}
          volumes:
            {{- toYaml . | nindent 12 }}
          {{- end }}
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
