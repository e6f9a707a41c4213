{{/* The objects' base name: the release name, or <release>-posgate. */}}
{{- define "posgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of one component (gateway, init, store). */}}
{{- define "posgate.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "posgate.labels" -}}
{{ include "posgate.selector" . }}
app.kubernetes.io/part-of: posgate
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "posgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The pod security context both the gateway and the init Job run with. */}}
{{- define "posgate.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The optional Redis Secret, mounted by the gateway and the init Job. */}}
{{- define "posgate.redisVolume" -}}
- name: redis
  secret:
    secretName: {{ include "posgate.fullname" . }}-redis
    defaultMode: 0440
    optional: true
{{- end -}}

{{/* The store settings: the ConfigMap's data, and the init hook's environment (the
hook runs before the ConfigMap exists). */}}
{{- define "posgate.store" -}}
POSGATE_CLUSTER: {{ .Values.store.cluster | quote }}
POSGATE_MEMBER_TTL: {{ .Values.store.memberTtl | quote }}
POSGATE_REDIS_URL: {{ .Values.store.redisUrl | quote }}
{{- range $k, $v := .Values.store.extra }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end -}}
