{{- define "zeps.labels" -}}
app.kubernetes.io/name: zeps-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "zeps.zookeeper" -}}
{{- if .Values.zookeeper.ensemble.enabled -}}
{{- $n := int .Values.zookeeper.ensemble.replicas -}}
{{- $port := ternary 2281 2181 (ne (include "zeps.zookeeperClientTLS" .) "") -}}
{{- range $i, $_ := until $n }}{{ if $i }},{{ end }}{{ $.Release.Name }}-zookeeper-{{ $i }}.{{ $.Release.Name }}-zookeeper.{{ $.Release.Namespace }}.svc:{{ $port }}{{ end -}}
{{- else if .Values.zookeeper.connect -}}
{{ .Values.zookeeper.connect }}
{{- else -}}
{{ fail "set zookeeper.connect (host:port,…) or zookeeper.ensemble.enabled=true" }}
{{- end -}}
{{- end -}}

{{- /* The Secret (keys user, password) with the operator's ZooKeeper identity: the user's own
(zookeeper.auth.existingSecret), or the one the chart makes from zookeeper.auth.user/password; "" for none. */ -}}
{{- define "zeps.zookeeperAuthSecret" -}}
{{- if .Values.zookeeper.auth.existingSecret -}}
{{ .Values.zookeeper.auth.existingSecret }}
{{- else if .Values.zookeeper.auth.password -}}
{{ .Release.Name }}-zookeeper-auth
{{- end -}}
{{- end -}}

{{/* zookeeper.ensemble.quorumAuth, or an empty dict (off) for a release upgraded with --reuse-values from a
chart without it: helm then leaves the new defaults out, and the ensemble keeps running as it did. */}}
{{- define "zeps.quorumAuth" -}}
{{- .Values.zookeeper.ensemble.quorumAuth | default dict | toJson -}}
{{- end -}}

{{/* zookeeper.ensemble.tls and .networkPolicy likewise: an empty dict (off) for a release upgraded with
--reuse-values from a chart without them. */}}
{{- define "zeps.zookeeperTLS" -}}
{{- .Values.zookeeper.ensemble.tls | default dict | toJson -}}
{{- end -}}
{{- define "zeps.zookeeperNetworkPolicy" -}}
{{- .Values.zookeeper.ensemble.networkPolicy | default dict | toJson -}}
{{- end -}}

{{/* The Secret holding the servers' certificates (ca.crt, tls.crt, tls.key), if quorum TLS is on. */}}
{{- define "zeps.zookeeperTLSSecret" -}}
{{- $tls := include "zeps.zookeeperTLS" . | fromJson -}}
{{- if $tls.enabled -}}
{{ $tls.existingSecret | default (printf "%s-zookeeper-tls" .Release.Name) }}
{{- end -}}
{{- end -}}

{{/* Whether the ensemble serves clients over TLS (zookeeper.ensemble.tls.clientMode): accept or
require, "" when not (TLS off, or clientMode off). */}}
{{- define "zeps.zookeeperClientTLS" -}}
{{- $tls := include "zeps.zookeeperTLS" . | fromJson -}}
{{- if and .Values.zookeeper.ensemble.enabled $tls.enabled (has $tls.clientMode (list "accept" "require")) -}}
{{ $tls.clientMode }}
{{- end -}}
{{- end -}}

{{/* The Secret whose ca.crt is the CA of the servers' client certificates, where clients speak TLS:
the in-chart ensemble's (tls.clientMode), or an external ensemble's (zookeeper.caSecret); "" for none. */}}
{{- define "zeps.zookeeperCASecret" -}}
{{- if .Values.zookeeper.ensemble.enabled -}}
{{- if (include "zeps.zookeeperClientTLS" .) }}{{ include "zeps.zookeeperTLSSecret" . }}{{ end -}}
{{- else -}}
{{ .Values.zookeeper.caSecret | default "" }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the ensemble's quorum identity (user, password), if quorum authentication is on. */}}
{{- define "zeps.zookeeperQuorumSecret" -}}
{{- $quorum := include "zeps.quorumAuth" . | fromJson -}}
{{- if $quorum.enabled -}}
{{ $quorum.existingSecret | default (printf "%s-zookeeper-quorum" .Release.Name) }}
{{- end -}}
{{- end -}}
