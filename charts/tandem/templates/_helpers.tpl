{{/*
Shared names and labels of the tandem chart.
*/}}

{{/* The chart's name, overridable with nameOverride. */}}
{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: fullnameOverride, else "<release>" when the release
name already contains the chart name, else "<release>-<chart>". It names
Services, which are DNS-1035 labels of at most 63 characters, with suffixes
of up to 17 ("-operator-metrics"): so dots become dashes and it is cut to
46 characters. One that does not start with a letter is refused.
*/}}
{{- define "tandem.fullname" -}}
{{- $full := "" }}
{{- if .Values.fullnameOverride }}
{{- $full = .Values.fullnameOverride }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $full = .Release.Name }}
{{- else }}
{{- $full = printf "%s-%s" .Release.Name $name }}
{{- end }}
{{- end }}
{{- $full = $full | replace "." "-" | trunc 46 | trimSuffix "-" }}
{{- if not (regexMatch "^[a-z]" $full) }}
{{- fail (printf "the release's full name %q must start with a lowercase letter: it names the chart's Services (DNS-1035 labels); choose another release name or set fullnameOverride" $full) }}
{{- end }}
{{- $full }}
{{- end }}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object of the release carries. */}}
{{- define "tandem.labels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator pods' selector (never changes across upgrades). */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "tandem.operatorServiceAccountName" -}}
{{- default (printf "%s-operator" (include "tandem.fullname" .)) .Values.operator.serviceAccount.name }}
{{- end }}

{{/* The router pods' ServiceAccount (passed to the operator as --router-service-account). */}}
{{- define "tandem.routerServiceAccountName" -}}
{{- .Values.router.serviceAccount.name }}
{{- end }}

{{/* "repository:tag", the tag defaulting to the chart's appVersion; a repository pinned by digest ("repo@sha256:...") is used as it is. */}}
{{- define "tandem.image" -}}
{{- $repository := .repository }}
{{- if .registry }}
{{- /* A first component with a dot or a colon, or localhost, is a registry (as the OCI distribution reference grammar reads it). */}}
{{- $repository = printf "%s/%s" .registry (regexReplaceAll "^(localhost|[^/]*[.:][^/]*)/" .repository "") }}
{{- end }}
{{- if contains "@" $repository }}
{{- $repository }}
{{- else }}
{{- printf "%s:%s" $repository (default .appVersion .tag) }}
{{- end }}
{{- end }}

{{/* Whether to render the ServiceMonitor: true, false, or "auto" (when the CRD is served). */}}
{{- define "tandem.serviceMonitorEnabled" -}}
{{- $setting := .Values.monitoring.serviceMonitor.enabled }}
{{- if eq (toString $setting) "auto" }}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- else if $setting }}true{{ end }}
{{- end }}

{{/*
Whether to render a monitoring.coreos.com/v1 object whose switch is
(dict "setting" true|false|"auto" "root" $): "auto" means when the API is served.
*/}}
{{- define "tandem.monitoringEnabled" -}}
{{- $setting := .setting }}
{{- if eq (toString $setting) "auto" }}
{{- if .root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- else if $setting }}true{{ end }}
{{- end }}

{{/* The labels of one alert rule (dict "alert" <its values> "root" $): severity and ruleLabels. */}}
{{- define "tandem.alertLabels" -}}
severity: {{ .alert.severity | quote }}
{{- with .root.Values.monitoring.prometheusRule.ruleLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}
