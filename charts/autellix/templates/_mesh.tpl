{{/* Envoy, the xDS Service and the shared store of gateway replicas (docs/cluster.md). */}}

{{- define "autellix.envoyName" -}}
{{- printf "%s-envoy" (include "autellix.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "autellix.xdsName" -}}
{{- printf "%s-xds" (include "autellix.operatorName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "autellix.storeName" -}}
{{- printf "%s-store" (include "autellix.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "true" when the gateways run on a shared store (the chart's, a Secret's URL, or a URL). */}}
{{- define "autellix.storeEnabled" -}}
{{- if or .Values.store.deploy .Values.store.urlSecret.name .Values.store.url }}true{{ end }}
{{- end }}

{{/* "true" when the release deploys its own store: store.deploy, and no URL of yours
     (a Secret's URL, then store.url, take precedence over the chart's Valkey). */}}
{{- define "autellix.storeDeployed" -}}
{{- if and .Values.store.deploy (not .Values.store.urlSecret.name) (not .Values.store.url) }}true{{ end }}
{{- end }}

{{/* The Secret (data key "password") holding the chart's store's password: yours
     (auth.storePassword.existingSecret) or the release's own (secrets.yaml). */}}
{{- define "autellix.storePasswordSecret" -}}
{{- default (printf "%s-store-password" (include "autellix.fullname" .)) .Values.auth.storePassword.existingSecret }}
{{- end }}

{{/* The chart's store's URL without its password (the operator's --epp-store-url; the pickers get the
     password from the Secret, as the gateways do). */}}
{{- define "autellix.storeAddress" -}}
{{- printf "%s.%s.svc:6379/0" (include "autellix.storeName" .) .Release.Namespace }}
{{- end }}

{{/* The gateway's AUTELLIX_STORE (= --store) when the URL is in a Secret or the chart's store;
     a plain store.url is passed as --store instead. The chart's store: the password from its Secret
     into AUTELLIX_STORE_PASSWORD, then into the URL by the kubelet's $(VAR) expansion (the variable
     comes first), so that no manifest holds it. */}}
{{- define "autellix.storeEnv" -}}
{{- if .Values.store.urlSecret.name }}
- name: AUTELLIX_STORE
  valueFrom:
    secretKeyRef: {name: {{ .Values.store.urlSecret.name }}, key: {{ .Values.store.urlSecret.key }}}
{{- else if include "autellix.storeDeployed" . }}
- name: AUTELLIX_STORE_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ include "autellix.storePasswordSecret" . }}, key: password}
- name: AUTELLIX_STORE
  value: {{ printf "redis://:$(AUTELLIX_STORE_PASSWORD)@%s" (include "autellix.storeAddress" .) | quote }}
{{- end }}
{{- end }}
