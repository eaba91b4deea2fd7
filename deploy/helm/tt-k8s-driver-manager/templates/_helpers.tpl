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
The builder image of each GCC major (TTDP_BUILDER_IMAGES), as JSON: driver.builderImages when
set; with a full driver.image, empty (the controller derives <driver.image>-gcc<N>); else
repository:tag-gcc<N> for 11 to 14 (tag defaults to appVersion; a digest names one image only).
*/}}
{{- define "ttdm.builderImages" -}}
{{- if .Values.driver.builderImages -}}
{{- toJson .Values.driver.builderImages -}}
{{- else if not .Values.driver.image -}}
{{- $images := dict -}}
{{- range list "11" "12" "13" "14" -}}
{{- $_ := set $images . (printf "%s:%s-gcc%s" $.Values.driver.repository ($.Values.driver.tag | default $.Chart.AppVersion) .) -}}
{{- end -}}
{{- toJson $images -}}
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
{{- with .Values.agent.cacheSizeLimit }}{{- $_ := set $pod "cacheSizeLimit" . -}}{{- end -}}
{{- with .Values.agent.kernelScanPeriod }}{{- $_ := set $pod "kernelScanPeriod" . -}}{{- end -}}
{{- toJson $pod -}}
{{- end -}}
