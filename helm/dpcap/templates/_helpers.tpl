{{/* The release's name, with the chart's appended only when the release does not already
name it: release "dpcap" gives dpcap-coordinator, release "ml" gives ml-dpcap-coordinator. */}}
{{- define "dpcap.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
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

{{/* Values that render but cannot work fail the render, each with its fix. Included by every
     workload template, so `helm lint` and `helm template` refuse them alike. */}}
{{- define "dpcap.validate" -}}
{{- if and .Values.store.sharedVolume.enabled (contains "://" .Values.store.url) -}}
{{- fail (printf "store.url %q is an object store, but store.sharedVolume.enabled mounts a volume at that path: set store.sharedVolume.enabled=false (or a filesystem path as store.url)" .Values.store.url) -}}
{{- end -}}
{{- if and (not .Values.store.sharedVolume.enabled) (not (contains "://" .Values.store.url)) -}}
{{- fail (printf "store.url %q is a path, but store.sharedVolume.enabled=false gives workers and the coordinator no shared volume there: enable it or use an object-store URL (s3://, gs://, az://)" .Values.store.url) -}}
{{- end -}}
{{- if and (eq .Values.workers.device "cuda") (lt (int .Values.workers.gpusPerWorker) 1) -}}
{{- fail "workers.device=cuda needs workers.gpusPerWorker >= 1 (each pod's nvidia.com/gpu limit); without it no GPU is scheduled" -}}
{{- end -}}
{{- if and (eq .Values.workers.device "cpu") (gt (int .Values.workers.gpusPerWorker) 0) -}}
{{- fail "workers.gpusPerWorker > 0 with workers.device=cpu reserves GPUs the workers never use: set workers.device=cuda or gpusPerWorker=0" -}}
{{- end -}}
{{- range $field := list "operatorToken" "viewerToken" "clusterToken" "coordinatorToken" "privacyAdminToken" -}}
{{- $token := index $.Values.auth $field -}}
{{- if and $token (lt (len $token) 16) -}}
{{- fail (printf "auth.%s has %d characters; the servers refuse tokens under 16: leave it empty to generate one, or give a longer one" $field (len $token)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A role's token: the value given, else the one already in the release's Secret (kept across
     upgrades), else a new random one. (dict "root" . "value" "operatorToken" "key" "operator-token") */}}
{{- define "dpcap.token" -}}
{{- $given := index .root.Values.auth .value -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace (include "dpcap.secretName" .root) -}}
{{- if $given -}}
{{- $given | quote -}}
{{- else if and $existing $existing.data (index $existing.data .key) -}}
{{- index $existing.data .key | b64dec | quote -}}
{{- else -}}
{{- randAlphaNum 40 | quote -}}
{{- end -}}
{{- end -}}
