{{/* Names and labels shared by every template. Selector labels are a fixed subset of the
common labels: they must never change on upgrade, while the others may. */}}

{{- define "goodput.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "goodput.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "goodput.forecasterName" -}}
{{- printf "%s-forecaster" (include "goodput.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "goodput.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "goodput.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: goodput
{{- end -}}

{{/* Selector labels of one component: include "goodput.selectorLabels" (list . "serving") */}}
{{- define "goodput.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "goodput.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "goodput.componentLabels" -}}
{{ include "goodput.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "goodput.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "goodput.engineImage" -}}
{{- if .Values.engine.image.repository -}}
{{- printf "%s:%s" .Values.engine.image.repository (default "latest" .Values.engine.image.tag) -}}
{{- else -}}
{{- include "goodput.image" . -}}
{{- end -}}
{{- end -}}

{{- define "goodput.forecasterServiceAccount" -}}
{{- if .Values.forecaster.serviceAccount.create -}}
{{- default (include "goodput.forecasterName" .) .Values.forecaster.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.forecaster.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The TLS Secret the forecaster serves the External Metrics API with. */}}
{{- define "goodput.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "goodput.forecasterName" .)) .Values.autoscaling.builtin.existingSecret -}}
{{- end -}}

{{- define "goodput.gracePeriod" -}}
{{- $d := .Values.serving.drain -}}
{{- add $d.endpointDelaySeconds $d.timeoutSeconds $d.extraGraceSeconds -}}
{{- end -}}
