{{/* Names shared by every template. */}}
{{- define "ttdm.fullname" -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- end -}}

{{- define "ttdm.labels" -}}
app.kubernetes.io/name: tt-k8s-driver-manager
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ttdm.selectorLabels" -}}
app.kubernetes.io/name: tt-k8s-driver-manager
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "ttdm.controllerServiceAccount" -}}
{{ include "ttdm.fullname" . }}-controller
{{- end -}}

{{- define "ttdm.agentServiceAccount" -}}
{{ include "ttdm.fullname" . }}-agent
{{- end -}}

{{- define "ttdm.controllerImage" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "ttdm.driverImage" -}}
{{ .Values.driver.image | default (printf "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:%s" .Chart.AppVersion) }}
{{- end -}}
