{{/* Names and labels shared by every template. */}}

{{- define "autellix.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "autellix.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "autellix.gatewayName" -}}
{{- printf "%s-gateway" (include "autellix.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "autellix.operatorName" -}}
{{- printf "%s-operator" (include "autellix.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "autellix.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "autellix.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: autellix
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" . "component" "gateway"). */}}
{{- define "autellix.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autellix.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* <imageRegistry>/<repository>:<tag or appVersion>: include with (dict "ctx" . "image" .Values.gateway.image). */}}
{{- define "autellix.image" -}}
{{- $registry := .ctx.Values.imageRegistry | trimSuffix "/" }}
{{- $repository := ternary (printf "%s/%s" $registry .image.repository) .image.repository (ne $registry "") }}
{{- printf "%s:%s" $repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* The namespace the gateway's discovery watches (when not all namespaces). */}}
{{- define "autellix.discoveryNamespace" -}}
{{- default .Release.Namespace .Values.gateway.discovery.namespace }}
{{- end }}

{{- define "autellix.gatewayAdminUrl" -}}
{{- if .Values.operator.gatewayAdminUrl }}
{{- .Values.operator.gatewayAdminUrl }}
{{- else }}
{{- printf "http://%s-admin.%s.svc:%v" (include "autellix.gatewayName" .) .Release.Namespace .Values.gateway.adminPort }}
{{- end }}
{{- end }}

{{- define "autellix.gatewayUrl" -}}
{{- if .Values.operator.gatewayUrl }}
{{- .Values.operator.gatewayUrl }}
{{- else if .Values.mesh.enabled }}
{{- /* through Envoy: a program's calls go to one replica */ -}}
{{- printf "http://%s.%s.svc:%v" (include "autellix.envoyName" .) .Release.Namespace .Values.mesh.envoy.service.port }}
{{- else }}
{{- printf "http://%s.%s.svc:%v" (include "autellix.gatewayName" .) .Release.Namespace .Values.gateway.service.port }}
{{- end }}
{{- end }}

{{/*
SchedulerConfig's fields as AUTELLIX_<NAME> variables (autellix.core.config.from_env):
lists joined by commas, whole numbers without a decimal point or exponent.
*/}}
{{- define "autellix.schedulerEnv" -}}
{{- $s := .Values.scheduler }}
{{- if and (hasKey $s "boundaries") (hasKey $s "quanta") }}
{{- $b := ternary $s.boundaries (splitList "," (toString $s.boundaries)) (kindIs "slice" $s.boundaries) }}
{{- $q := ternary $s.quanta (splitList "," (toString $s.quanta)) (kindIs "slice" $s.quanta) }}
{{- if ne (len $q) (add1 (len $b)) }}
{{- fail (printf "scheduler.quanta: expected %d values (one per queue, %d boundaries), got %d" (add1 (len $b)) (len $b) (len $q)) }}
{{- end }}
{{- end }}
{{- range $key, $value := $s }}
- name: {{ printf "AUTELLIX_%s" (upper $key) }}
  value: {{ include "autellix.envValue" $value | quote }}
{{- end }}
{{- end }}

{{- define "autellix.envValue" -}}
{{- if kindIs "slice" . }}
{{- $parts := list }}
{{- range . }}{{ $parts = append $parts (include "autellix.envValue" .) }}{{ end }}
{{- join "," $parts }}
{{- else if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}
{{- int64 . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{- define "autellix.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end }}

{{- define "autellix.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Cluster-scoped objects (ClusterRoles) are named after the namespace too: one per release. */}}
{{- define "autellix.clusterScopedName" -}}
{{- printf "%s-%s" .ctx.Release.Namespace .name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The namespaces the operator serves, one per line: the release's, then operator.namespaces. */}}
{{- define "autellix.operatorNamespaces" -}}
{{- prepend .Values.operator.namespaces .Release.Namespace | uniq | join "\n" }}
{{- end }}

{{/* The operator's leader-election Lease (made by the chart, so that `helm uninstall` removes it). */}}
{{- define "autellix.operatorLease" -}}
{{- include "autellix.operatorName" . }}
{{- end }}

{{/* The operator's rules in the namespaces it serves (autellix_lab.operator_rights.OPERATOR_RULES, scope "served"). */}}
{{- define "autellix.operatorServedRules" -}}
# Its resources: kopf's watch and progress annotations (and dropping a finalizer an older operator
# left); a child's event reads its engine; the autoscaler patches spec.replicas.
- apiGroups: [autellix.ai]
  resources: [autellixengines]
  verbs: [get, list, watch, patch]
- apiGroups: [autellix.ai]
  resources: [agentprograms]
  verbs: [list, watch, patch]
- apiGroups: [autellix.ai]
  resources: [autellixengines/status, agentprograms/status]
  verbs: [patch]
# Children carry blockOwnerDeletion owner references to these.
- apiGroups: [autellix.ai]
  resources: [autellixengines/finalizers, agentprograms/finalizers]
  verbs: [update]
# An engine's children: applied, and watched for drift.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch]
# A program's Job: created once, read for its outcome.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create]
# The autoscaler's pod-deletion-cost annotation on the engine it drained.
- apiGroups: [""]
  resources: [pods]
  verbs: [patch]
# Which pod is behind which engine URL (the gateway's own view).
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list]
# An HPA or KEDA targeting an engine: the built-in autoscaler stands down.
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list]
# Events: what the operator did and why (scaled, drained, programs started, failed, ...).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}


{{/* The Secrets of keys and tokens: yours (auth.*.existingSecret) or the release's own (secrets.yaml). */}}
{{- define "autellix.tenantKeysSecret" -}}
{{- default (printf "%s-tenant-keys" (include "autellix.fullname" .)) .Values.auth.tenantKeys.existingSecret }}
{{- end }}

{{- define "autellix.adminKeysSecret" -}}
{{- default (printf "%s-admin-keys" (include "autellix.fullname" .)) .Values.auth.adminKeys.existingSecret }}
{{- end }}

{{- define "autellix.engineTokenSecret" -}}
{{- default (printf "%s-engine-token" (include "autellix.fullname" .)) .Values.auth.engineToken.existingSecret }}
{{- end }}
