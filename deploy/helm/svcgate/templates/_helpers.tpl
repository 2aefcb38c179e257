{{/*
Names. The release name alone when it already holds the chart's name, so `helm install svcgate`
makes objects named svcgate, as the plain manifests do. Kubernetes names stop at 63 characters.
*/}}
{{- define "svcgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "svcgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The worker's objects: the gateway's name with -worker, within 63 characters. */}}
{{- define "svcgate.workerName" -}}
{{- printf "%s-worker" (include "svcgate.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "svcgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The standard labels; callers add app.kubernetes.io/component. */}}
{{- define "svcgate.labels" -}}
helm.sh/chart: {{ include "svcgate.chart" . }}
{{ include "svcgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: svcgate
{{- end }}

{{/* Selector labels: fixed for the life of a release (a Deployment's selector cannot change). */}}
{{- define "svcgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "svcgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "svcgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The Secret with SVCGATE_STORE_URL and SVCGATE_SERVER_ADMIN_TOKEN. */}}
{{- define "svcgate.secretName" -}}
{{- if .Values.secret.create }}
{{- include "svcgate.fullname" . }}
{{- else }}
{{- required "secret.existingSecret: name the Secret holding SVCGATE_STORE_URL and SVCGATE_SERVER_ADMIN_TOKEN (or set secret.create)" .Values.secret.existingSecret }}
{{- end }}
{{- end }}

{{/*
Shutdown timing, in seconds. After SIGTERM svcgate drains for shutdown.graceSeconds, gives
requests in flight shutdown.timeoutSeconds, then flushes (up to 5 s) and exits. A sidecar's
application must keep serving through the drain and the requests in flight (its preStop sleep),
and the pod's grace period must cover both with room for the application to stop.
*/}}
{{- define "svcgate.preStopSleepSeconds" -}}
{{- if kindIs "invalid" .Values.sidecar.preStopSleepSeconds }}
{{- add .Values.shutdown.graceSeconds .Values.shutdown.timeoutSeconds 5 }}
{{- else }}
{{- .Values.sidecar.preStopSleepSeconds | int }}
{{- end }}
{{- end }}

{{- define "svcgate.terminationGracePeriodSeconds" -}}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- .Values.terminationGracePeriodSeconds | int }}
{{- else if eq .Values.mode "sidecar" }}
{{- add (include "svcgate.preStopSleepSeconds" . | int) 10 }}
{{- else }}
{{- add .Values.shutdown.graceSeconds .Values.shutdown.timeoutSeconds 10 }}
{{- end }}
{{- end }}

{{/* Pod annotations: the config's checksum rolls the pods on a change (svcgate reads it once). */}}
{{- define "svcgate.podAnnotations" -}}
checksum/config: {{ .Values.config | sha256sum }}
{{- if .Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.ports.metrics | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The spool (and, with an embedded worker, the outbox) under the image's working directory. */}}
{{- define "svcgate.spoolVolume" -}}
- name: spool
{{- if .Values.spool.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.spool.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}

{{- define "svcgate.configVolume" -}}
- name: config
  configMap:
    name: {{ include "svcgate.fullname" . }}
{{- end }}

{{/* SMTP settings for the process that delivers webhooks (only it sends mail). */}}
{{- define "svcgate.smtpEnv" -}}
{{- with .Values.worker.smtp }}
{{- if .host }}
- {name: SVCGATE_SMTP_HOST, value: {{ .host | quote }}}
- {name: SVCGATE_SMTP_PORT, value: {{ .port | int | quote }}}
- {name: SVCGATE_SMTP_TLS, value: {{ .tls | quote }}}
{{- end }}
{{- if .from }}
- {name: SVCGATE_SMTP_FROM, value: {{ .from | quote }}}
{{- end }}
{{- end }}
{{- end }}

{{/* Where traces go, for the gateways and the workers alike. */}}
{{- define "svcgate.tracingEnv" -}}
{{- with .Values.tracing.otlpEndpoint }}
- {name: SVCGATE_TRACING_OTLP_ENDPOINT, value: {{ . | quote }}}
{{- end }}
{{- end }}

{{/* The gateway container, the same in both modes. */}}
{{- define "svcgate.gatewayContainer" -}}
- name: svcgate
  image: {{ include "svcgate.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - serve
    {{- if .Values.worker.enabled }}
    - --no-worker
    {{- end }}
    - --config
    - /etc/svcgate/svcgate.toml
  env:
    - {name: SVCGATE_SERVER_LISTEN, value: "0.0.0.0:{{ .Values.ports.http }}"}
    {{- if .Values.adminService.enabled }}
    - {name: SVCGATE_SERVER_ADMIN_LISTEN, value: "0.0.0.0:{{ .Values.ports.admin }}"}
    {{- else }}
    - {name: SVCGATE_SERVER_ADMIN_LISTEN, value: "127.0.0.1:{{ .Values.ports.admin }}"}
    {{- end }}
    - {name: SVCGATE_SERVER_METRICS_LISTEN, value: "0.0.0.0:{{ .Values.ports.metrics }}"}
    - {name: SVCGATE_SERVER_SHUTDOWN_GRACE_SECONDS, value: {{ .Values.shutdown.graceSeconds | int | quote }}}
    - {name: SVCGATE_SERVER_SHUTDOWN_TIMEOUT_SECONDS, value: {{ .Values.shutdown.timeoutSeconds | int | quote }}}
    - {name: SVCGATE_METERING_SPOOL_DIR, value: /var/lib/svcgate/spool}
    {{- if eq .Values.mode "sidecar" }}
    - {name: SVCGATE_UPSTREAM_LIVE, value: "127.0.0.1:{{ .Values.sidecar.appPort }}"}
    {{- end }}
    {{- if not .Values.worker.enabled }}
    {{- with include "svcgate.smtpEnv" . | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- end }}
    {{- with include "svcgate.tracingEnv" . | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  envFrom:
    - secretRef:
        name: {{ include "svcgate.secretName" . }}
    {{- if not .Values.worker.enabled }}
    - secretRef:
        name: {{ .Values.worker.smtp.existingSecret }}
        optional: true
    {{- end }}
  ports:
    - {name: http, containerPort: {{ .Values.ports.http }}}
    {{- if .Values.adminService.enabled }}
    - {name: admin, containerPort: {{ .Values.ports.admin }}}
    {{- end }}
    - {name: metrics, containerPort: {{ .Values.ports.metrics }}}
  readinessProbe:
    httpGet: {path: /readyz, port: http}
    {{- toYaml .Values.readinessProbe | nindent 4 }}
  livenessProbe:
    httpGet: {path: /healthz, port: http}
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - {name: config, mountPath: /etc/svcgate, readOnly: true}
    - {name: spool, mountPath: /var/lib/svcgate}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
