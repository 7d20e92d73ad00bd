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
{{- /* "true" when the forecaster serves TLS: its External Metrics API (mode builtin), or KEDA
reading it directly (mode keda, trigger metrics-api or external). */}}
{{- define "goodput.forecasterTLS" -}}
{{- $a := .Values.autoscaling -}}
{{- if or (eq $a.mode "builtin") (and (eq $a.mode "keda") (ne $a.keda.trigger "prometheus")) }}true{{ end -}}
{{- end -}}

{{- define "goodput.tlsExistingSecret" -}}
{{- if eq .Values.autoscaling.mode "keda" }}{{ .Values.autoscaling.keda.existingSecret }}{{ else }}{{ .Values.autoscaling.builtin.existingSecret }}{{ end -}}
{{- end -}}

{{- define "goodput.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "goodput.forecasterName" .)) (include "goodput.tlsExistingSecret" .) -}}
{{- end -}}

{{- /* The chart-made TLS Secret's data as YAML (tls.crt, tls.key, ca.crt, base64): reused on
upgrade (lookup is empty offline and on first install), else a new CA and a serving certificate
for the forecaster Service's DNS names. Takes (list $ validityDays). Only one template per render
calls it (the modes that use it exclude each other), so there is one CA. */}}
{{- define "goodput.tlsData" -}}
{{- $root := index . 0 -}}
{{- $svc := include "goodput.forecasterName" $root -}}
{{- $ns := $root.Release.Namespace -}}
{{- $existing := lookup "v1" "Secret" $ns (include "goodput.tlsSecretName" $root) -}}
{{- if and $existing (index $existing.data "ca.crt") }}
{{- toYaml (dict "tls.crt" (index $existing.data "tls.crt") "tls.key" (index $existing.data "tls.key") "ca.crt" (index $existing.data "ca.crt")) }}
{{- else }}
{{- $ca := genCA (printf "%s-ca" $svc) (int (index . 1)) -}}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $names (int (index . 1)) $ca -}}
{{- toYaml (dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" ($ca.Cert | b64enc)) }}
{{- end }}
{{- end -}}

{{- /* The TLS Secret manifest for (list $ data). */}}
{{- define "goodput.tlsSecret" -}}
{{- $root := index . 0 -}}{{- $data := index . 1 -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ include "goodput.tlsSecretName" $root }}
  labels:
    {{- include "goodput.componentLabels" (list $root "forecaster") | nindent 4 }}
type: kubernetes.io/tls
data:
  tls.crt: {{ index $data "tls.crt" }}
  tls.key: {{ index $data "tls.key" }}
  ca.crt: {{ index $data "ca.crt" }}
{{- end -}}

{{- define "goodput.gracePeriod" -}}
{{- $d := .Values.serving.drain -}}
{{- add $d.endpointDelaySeconds $d.timeoutSeconds $d.extraGraceSeconds -}}
{{- end -}}
