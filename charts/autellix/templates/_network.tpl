{{/*
NetworkPolicy peers shared by networkpolicies.yaml, store.yaml and epp-rbac.yaml. Each helper renders a
YAML list of NetworkPolicyPeers (read back with fromYamlArray), so that a policy never writes an empty
list where Kubernetes would read "everyone".
*/}}

{{/* This release's pods of one component, in the release namespace: (dict "ctx" . "component" "gateway"). */}}
{{- define "autellix.releasePeer" -}}
{{- $pods := include "autellix.selectorLabels" . | fromYaml }}
{{- list (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .ctx.Release.Namespace)) "podSelector" (dict "matchLabels" $pods)) | toYaml }}
{{- end }}

{{/* Pods the operator makes (app.kubernetes.io/managed-by=autellix-operator) of one component ("program":
     AgentProgram Jobs, "epp": endpoint pickers), in the namespaces it serves only: (dict "ctx" . "component" "epp"). */}}
{{- define "autellix.servedPeer" -}}
{{- $served := splitList "\n" (include "autellix.operatorNamespaces" .ctx) }}
{{- $namespaces := dict "matchExpressions" (list (dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" $served)) }}
{{- $pods := dict "matchLabels" (dict "app.kubernetes.io/component" .component "app.kubernetes.io/managed-by" "autellix-operator") }}
{{- list (dict "namespaceSelector" $namespaces "podSelector" $pods) | toYaml }}
{{- end }}

{{/*
Who may call the OpenAI endpoint (Envoy's port, and the gateway's tenant port) when
networkPolicy.tenantsFrom limits it: those peers, the AgentProgram Jobs of the served namespaces and the
operator (the tenant routes of a gateway an AgentProgram names by URL). An empty list: tenantsFrom is
empty, anyone may.
*/}}
{{- define "autellix.tenantPeers" -}}
{{- $peers := list }}
{{- if .Values.networkPolicy.tenantsFrom }}
{{- $peers = concat $peers .Values.networkPolicy.tenantsFrom }}
{{- if .Values.operator.enabled }}
{{- $peers = concat $peers (include "autellix.servedPeer" (dict "ctx" . "component" "program") | fromYamlArray) }}
{{- $peers = concat $peers (include "autellix.releasePeer" (dict "ctx" . "component" "operator") | fromYamlArray) }}
{{- end }}
{{- end }}
{{- toYaml $peers }}
{{- end }}
