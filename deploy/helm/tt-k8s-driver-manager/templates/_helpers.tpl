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

{{/* repository@digest when a digest is set, else repository:tag (tag defaults to appVersion). */}}
{{- define "ttdm.imageRef" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end -}}
{{- end -}}

{{- define "ttdm.controllerImage" -}}
{{ include "ttdm.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) }}
{{- end -}}

{{- define "ttdm.driverImage" -}}
{{- if .Values.driver.image -}}
{{ .Values.driver.image }}
{{- else -}}
{{ include "ttdm.imageRef" (dict "image" .Values.driver "appVersion" .Chart.AppVersion) }}
{{- end -}}
{{- end -}}

{{/*
What the controller adds to every agent pod (TTDP_AGENT_POD): the pull secrets (the chart's and
the agents' own, by name), resources, tolerations, node selector and proxy.
*/}}
{{- define "ttdm.agentPod" -}}
{{- $secrets := list -}}
{{- range (concat .Values.imagePullSecrets .Values.agent.imagePullSecrets) }}
{{- $secrets = append $secrets .name -}}
{{- end -}}
{{- $pod := dict "imagePullSecrets" $secrets "tolerations" .Values.agent.tolerations "nodeSelector" .Values.agent.nodeSelector "proxy" .Values.proxy -}}
{{- with .Values.agent.resources }}{{- $_ := set $pod "resources" . -}}{{- end -}}
{{- toJson $pod -}}
{{- end -}}
