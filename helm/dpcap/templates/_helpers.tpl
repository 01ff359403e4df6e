{{- define "dpcap.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dpcap.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dpcap.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dpcap.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-tokens" (include "dpcap.fullname" .)) -}}
{{- end -}}

{{- define "dpcap.capabilitySecretName" -}}
{{- .Values.capabilities.existingSecret | default (printf "%s-capability" (include "dpcap.fullname" .)) -}}
{{- end -}}

{{/* The capability key file: coordinator and accountant only. */}}
{{- define "dpcap.capabilityEnv" -}}
- name: DPCAP_CAPABILITY_KEY_FILE
  value: /etc/dpcap/capability/capability.keys
{{- end -}}

{{- define "dpcap.capabilityMount" -}}
- {name: capability, mountPath: /etc/dpcap/capability, readOnly: true}
{{- end -}}

{{- define "dpcap.capabilityVolume" -}}
- name: capability
  secret: {secretName: {{ include "dpcap.capabilitySecretName" . | quote }}, defaultMode: 0400}
{{- end -}}

{{- define "dpcap.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{- define "dpcap.storeEnv" -}}
- name: DPCAP_STORE
  value: {{ .Values.store.url | quote }}
{{- with .Values.store.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "dpcap.security" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
{{- end -}}

{{/* A token from the chart's Secret as an env var: (dict "root" . "env" NAME "key" KEY). */}}
{{- define "dpcap.tokenEnv" -}}
- name: {{ .env }}
  valueFrom: {secretKeyRef: {name: {{ include "dpcap.secretName" .root }}, key: {{ .key }}}}
{{- end -}}

{{/* "https" with TLS, "http" with the explicit insecure choice; fails otherwise. */}}
{{- define "dpcap.scheme" -}}
{{- if .Values.tls.existingSecret -}}https
{{- else if .Values.tls.insecure -}}http
{{- else -}}
{{- fail "set tls.existingSecret (a Secret with tls.crt, tls.key and ca.crt) or, explicitly, tls.insecure=true" -}}
{{- end -}}
{{- end -}}

{{/* Server TLS env (or the --insecure opt-in), for the accountant and the coordinator. */}}
{{- define "dpcap.serverTlsEnv" -}}
{{- if .Values.tls.existingSecret }}
- {name: DPCAP_TLS_CERT, value: /etc/dpcap/tls/tls.crt}
- {name: DPCAP_TLS_KEY, value: /etc/dpcap/tls/tls.key}
{{- end }}
{{- end -}}

{{/* Client TLS env: trust the chart's CA. */}}
{{- define "dpcap.clientTlsEnv" -}}
{{- if .Values.tls.existingSecret }}
- {name: DPCAP_TLS_CA, value: /etc/dpcap/tls/ca.crt}
{{- end }}
{{- end -}}

{{- define "dpcap.tlsMount" -}}
{{- if .Values.tls.existingSecret }}
- {name: tls, mountPath: /etc/dpcap/tls, readOnly: true}
{{- end }}
{{- end -}}

{{- define "dpcap.tlsVolume" -}}
{{- if .Values.tls.existingSecret }}
- name: tls
  secret: {secretName: {{ .Values.tls.existingSecret | quote }}}
{{- end }}
{{- end -}}

{{/* A gRPC health probe in plaintext; the metrics port's /healthz under TLS. */}}
{{- define "dpcap.probe" -}}
{{- if .root.Values.tls.existingSecret }}
httpGet: {path: /healthz, port: {{ .metrics }}}
{{- else if .service }}
grpc: {port: {{ .port }}, service: {{ .service }}}
{{- else }}
grpc: {port: {{ .port }}}
{{- end }}
{{- end -}}

{{/* Every container: no privilege escalation, no capabilities, a read-only root filesystem
     (writable paths are volumes: /tmp, the ledger, the store). */}}
{{- define "dpcap.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end -}}
