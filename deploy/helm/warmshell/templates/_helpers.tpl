{{/*
Names, labels and the derived settings every template shares. Anything computed from more than one
value lives here, so the config, the Deployment and the RBAC can never disagree about it.
*/}}

{{- define "warmshell.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "warmshell.fullname" -}}
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

{{- define "warmshell.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "warmshell.selectorLabels" -}}
app.kubernetes.io/name: {{ include "warmshell.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "warmshell.labels" -}}
helm.sh/chart: {{ include "warmshell.chart" . }}
{{ include "warmshell.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: warmshell
{{- end }}

{{/* Labels of the gateway's own objects (Deployment, pods, Service). */}}
{{- define "warmshell.gatewaySelectorLabels" -}}
{{ include "warmshell.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "warmshell.gatewayServiceAccountName" -}}
{{- default (include "warmshell.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "warmshell.sandboxServiceAccountName" -}}
{{- default (printf "%s-sandbox" (include "warmshell.fullname" .)) .Values.sandbox.serviceAccount.name }}
{{- end }}

{{- define "warmshell.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.sandbox.namespace }}
{{- end }}

{{- define "warmshell.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "warmshell.sandboxImage" -}}
{{- default (include "warmshell.image" .) .Values.sandbox.image }}
{{- end }}

{{- define "warmshell.gatewayAddress" -}}
{{- if .Values.gateway.address }}
{{- .Values.gateway.address }}
{{- else }}
{{- printf "%s.%s.svc.%s:%d" (include "warmshell.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.service.grpcPort) }}
{{- end }}
{{- end }}

{{- define "warmshell.egressAddress" -}}
{{- printf "%s-egress.%s.svc.%s:%d" (include "warmshell.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.egress.port) }}
{{- end }}

{{- define "warmshell.leaseName" -}}
{{- default (printf "%s-leader" (include "warmshell.fullname" .)) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
"true" when the profile reconciler actually runs: it generates pools for claim allocation, so it is
a sub-feature of warm pooling and is off (config and RBAC) whenever warmPooling.enabled is false.
*/}}
{{- define "warmshell.profilesEnabled" -}}
{{- if and .Values.warmPooling.enabled .Values.warmPooling.profiles.enabled }}true{{ end }}
{{- end }}

{{- define "warmshell.signingKeySecretName" -}}
{{- default (printf "%s-signing-key" (include "warmshell.fullname" .)) .Values.signingKey.existingSecret }}
{{- end }}

{{- define "warmshell.apiTokenSecretName" -}}
{{- default (printf "%s-api-token" (include "warmshell.fullname" .)) .Values.apiToken.existingSecret }}
{{- end }}

{{- define "warmshell.proofKeySecretName" -}}
{{- default (printf "%s-proof-key" (include "warmshell.fullname" .)) .Values.proofKey.existingSecret }}
{{- end }}

{{- define "warmshell.secretsKeySecretName" -}}
{{- default (printf "%s-secrets-key" (include "warmshell.fullname" .)) .Values.secretsKey.existingSecret }}
{{- end }}

{{- define "warmshell.replicaTokenSecretName" -}}
{{- default (printf "%s-replica-token" (include "warmshell.fullname" .)) .Values.replicaToken.existingSecret }}
{{- end }}

{{/* "true" when the store is the external Postgres (replicas may share it), else "". */}}
{{- define "warmshell.postgres" -}}
{{- if .Values.store.postgres.urlSecret }}true{{ end }}
{{- end }}

{{- define "warmshell.pvcName" -}}
{{- default (printf "%s-state" (include "warmshell.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/*
The gateway id is part of the sandbox-token audience and labels the gateway's claims, so every
replica and every restart must see the same one. Derived from the release's namespace and name:
stable across upgrades, distinct between releases, a valid label value (16 hex).
*/}}
{{- define "warmshell.gatewayId" -}}
{{- printf "%s/%s" .Release.Namespace (include "warmshell.fullname" .) | sha256sum | trunc 16 }}
{{- end }}

{{/* Combinations the gateway cannot run with fail the render with a reason. */}}
{{- define "warmshell.validate" -}}
{{- if and (gt (int .Values.gateway.replicas) 1) (not (include "warmshell.postgres" .)) }}
{{- fail "gateway.replicas > 1 needs a shared store: without store.postgres.urlSecret the store is SQLite in one pod's state directory, which replicas cannot share. Set store.postgres.urlSecret, or use 1 replica." }}
{{- end }}
{{- if and (include "warmshell.postgres" .) (le (int .Values.gateway.terminationGracePeriodSeconds) (add (int (ceil .Values.gateway.drainSeconds)) 5)) }}
{{- fail "gateway.terminationGracePeriodSeconds must exceed gateway.drainSeconds by more than 5: a replica drains, then needs a few seconds to stop." }}
{{- end }}
{{- if and .Values.preflight.enabled (lookup "v1" "Namespace" "" .Release.Namespace) }}
{{- /* lookup returns an empty map under `helm template`, so this runs only against a cluster. */}}
{{- if not (or (.Capabilities.APIVersions.Has "agents.x-k8s.io/v1beta1") (.Capabilities.APIVersions.Has "agents.x-k8s.io/v1alpha1")) }}
{{- fail "agent-sandbox is not installed: the Sandbox CRD (agents.x-k8s.io) is not served by this cluster. Install it first (kubectl apply -f https://github.com/kubernetes-sigs/agent-sandbox/releases/latest/download/manifest.yaml), or set preflight.enabled=false." }}
{{- end }}
{{- end }}
{{- end }}
