{{- define "zeps.labels" -}}
app.kubernetes.io/name: zeps-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "zeps.zookeeper" -}}
{{- if .Values.zookeeper.ensemble.enabled -}}
{{- $n := int .Values.zookeeper.ensemble.replicas -}}
{{- range $i, $_ := until $n }}{{ if $i }},{{ end }}{{ $.Release.Name }}-zookeeper-{{ $i }}.{{ $.Release.Name }}-zookeeper.{{ $.Release.Namespace }}.svc:2181{{ end -}}
{{- else if .Values.zookeeper.connect -}}
{{ .Values.zookeeper.connect }}
{{- else -}}
{{ fail "set zookeeper.connect (host:port,…) or zookeeper.ensemble.enabled=true" }}
{{- end -}}
{{- end -}}
