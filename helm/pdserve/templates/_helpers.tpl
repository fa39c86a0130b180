{{/* Names, labels and shared pod pieces of the pdserve chart. */}}

{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release> when it already contains the chart name, else <release>-<chart>. */}}
{{- define "pdserve.fullname" -}}
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

{{/* Name of one component's objects: (dict "root" $ "component" "router"). */}}
{{- define "pdserve.componentName" -}}
{{- printf "%s-%s" (include "pdserve.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pdserve.labels" -}}
helm.sh/chart: {{ include "pdserve.chart" .root }}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/part-of: pdserve
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) -}}
{{- end -}}

{{/* The ConfigMap holding the flagfiles. */}}
{{- define "pdserve.configName" -}}
{{- printf "%s-config" (include "pdserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
One flagfile: every entry of a flags map as --name=value, sorted by name. Helm reads every number
in values as a float64, which prints 4000000 as "4e+06": numbers and booleans go through toJson.
*/}}
{{- define "pdserve.flagfile" -}}
{{- range $name, $value := . }}
{{- if kindIs "string" $value }}
--{{ $name }}={{ $value }}
{{- else if or (kindIs "map" $value) (kindIs "slice" $value) }}
{{- fail (printf "flag --%s: a flag value is a string, number or boolean, not %s" $name (kindOf $value)) }}
{{- else }}
--{{ $name }}={{ toJson $value }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Redis: the address router and tierd use, and the Secret with its password. */}}
{{- define "pdserve.redisAddress" -}}
{{- if eq .Values.redis.mode "bundled" -}}
{{- printf "%s:%d" (include "pdserve.componentName" (dict "root" . "component" "redis")) (int .Values.redis.port) -}}
{{- else if eq .Values.redis.mode "external" -}}
{{- required "redis.external.address is required when redis.mode is external (host:port)" .Values.redis.external.address -}}
{{- else -}}
{{- fail (printf "redis.mode must be bundled or external, got %q" .Values.redis.mode) -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.redisSecretName" -}}
{{- if .Values.redis.auth.existingSecret -}}
{{- .Values.redis.auth.existingSecret -}}
{{- else if not .Values.redis.auth.password -}}
{{- fail "redis.auth.enabled is true: set redis.auth.existingSecret (a Secret you create, e.g. kubectl create secret generic pdserve-redis --from-literal=password=$(openssl rand -hex 32)) or redis.auth.password (kept in the release's values); the chart generates none, as a password made at render time changes on every helm template or Argo CD render" -}}
{{- else -}}
{{- printf "%s-redis-auth" (include "pdserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.redisSecretKey" -}}
{{- if .Values.redis.auth.existingSecret -}}
{{- .Values.redis.auth.existingSecretKey -}}
{{- else -}}
password
{{- end -}}
{{- end -}}

{{/* Args of router and tierd for the Redis index (the password is a mounted file). */}}
{{- define "pdserve.redisArgs" -}}
- --redis_address={{ include "pdserve.redisAddress" . }}
- --redis_key_prefix={{ .Values.cluster.redisKeyPrefix }}
{{- if .Values.redis.auth.enabled }}
- --redis_password_file=/etc/pdserve/redis/{{ include "pdserve.redisSecretKey" . }}
{{- end }}
{{- end -}}

{{- define "pdserve.redisAuthMount" -}}
{{- if .Values.redis.auth.enabled -}}
- name: redis-auth
  mountPath: /etc/pdserve/redis
  readOnly: true
{{- end }}
{{- end -}}

{{- define "pdserve.redisAuthVolume" -}}
{{- if .Values.redis.auth.enabled -}}
- name: redis-auth
  secret:
    secretName: {{ include "pdserve.redisSecretName" . }}
    defaultMode: 288  # 0440: the runtime uid reads it through fsGroup
    items:
      - key: {{ include "pdserve.redisSecretKey" . }}
        path: {{ include "pdserve.redisSecretKey" . }}
{{- end }}
{{- end -}}

{{/* The model volume and its mount (model.source: hostPath | pvc | image). */}}
{{- define "pdserve.modelVolume" -}}
{{- if eq .Values.model.source "hostPath" -}}
# hostPath fails the baseline and restricted Pod Security levels: model.source pvc or image
# pass them.
- name: model
  hostPath:
    path: {{ .Values.model.hostPath }}
    type: Directory
{{- else if eq .Values.model.source "pvc" -}}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.existingClaim is required when model.source is pvc" .Values.model.existingClaim }}
    readOnly: true
{{- else if ne .Values.model.source "image" }}
{{- fail (printf "model.source must be hostPath, pvc or image, got %q" .Values.model.source) }}
{{- end }}
{{- end -}}

{{- define "pdserve.modelMount" -}}
{{- if ne .Values.model.source "image" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "pdserve.modelArgs" -}}
- --model={{ required "model.path is required" .Values.model.path }}
{{- if .Values.model.tokenizer }}
- --tokenizer={{ .Values.model.tokenizer }}
{{- end }}
{{- end -}}

{{/* Downward-API env every pdserve container gets. */}}
{{- define "pdserve.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}

{{/*
Probes: (dict "root" $ "port" <grpc port> "startupFailureThreshold" N). Plaintext: gRPC probes on
grpc.health.v1 (Kubernetes >= 1.24). Secure mode: the kubelet's gRPC probe speaks no TLS, so
readiness and startup check that the gRPC port accepts connections (it is bound once the model is
loaded) and liveness asks /healthz on the metrics port (plain HTTP).
*/}}
{{- define "pdserve.grpcProbes" -}}
{{- $check := dict "grpc" (dict "port" .port) -}}
{{- $live := dict "grpc" (dict "port" .port) -}}
{{- if .root.Values.security.enabled -}}
{{- $check = dict "tcpSocket" (dict "port" "grpc") -}}
{{- $live = dict "httpGet" (dict "path" "/healthz" "port" "metrics") -}}
{{- end -}}
readinessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  {{- toYaml $live | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- if .startupFailureThreshold }}
startupProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 10
  failureThreshold: {{ .startupFailureThreshold }}
{{- end }}
{{- end -}}

{{/* Checksum of the flagfiles, so a changed flag rolls the pods. */}}
{{- define "pdserve.configChecksum" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end -}}

{{/* Worker pod addresses for the router: <name>-<i>.<name>:<port>, comma-separated. */}}
{{- define "pdserve.workerAddresses" -}}
{{- $name := include "pdserve.componentName" (dict "root" .root "component" .role) -}}
{{- $v := index .root.Values .role -}}
{{- $out := list -}}
{{- range $i := until (int $v.replicas) -}}
{{- $out = append $out (printf "%s-%d.%s:%d" $name $i $name (int $v.grpcPort)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* A writable /tmp for containers with a read-only root filesystem. */}}
{{- define "pdserve.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{- define "pdserve.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/*
Secure mode (security.*): the Secrets are named or the render fails. Files are mounted read-only
under /etc/pdserve/<what>/ with mode 0440 (group = fsGroup) and passed to the binaries' flags.
*/}}
{{- define "pdserve.checkSecurity" -}}
{{- if .Values.security.enabled -}}
{{- $sec := .Values.security -}}
{{- $hint := "(docs/deploy.md, \"Secure mode\"), or set security.enabled=false for a development cluster" -}}
{{- if not $sec.tls.existingSecret -}}
{{- fail (printf "security.enabled is true: security.tls.existingSecret must name the Secret with the cluster CA, certificate and key (%s, %s, %s) %s" $sec.tls.caKey $sec.tls.certKey $sec.tls.keyKey $hint) -}}
{{- end -}}
{{- if not $sec.clusterToken.existingSecret -}}
{{- fail (printf "security.enabled is true: security.clusterToken.existingSecret must name the Secret with the cluster token (key %s) %s" $sec.clusterToken.key $hint) -}}
{{- end -}}
{{- if not $sec.apiKeys.existingSecret -}}
{{- fail (printf "security.enabled is true: security.apiKeys.existingSecret must name the Secret with the API keys (key %s, 'tenant:key' lines) %s" $sec.apiKeys.key $hint) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Flags of one component: (dict "root" $ "component" "router"|"worker"|"tierd"). */}}
{{- define "pdserve.securityArgs" -}}
{{- if .root.Values.security.enabled -}}
{{- if and (eq .component "router") .root.Values.security.publicTls.existingSecret }}
- --tls_cert=/etc/pdserve/public-tls/tls.crt
- --tls_key=/etc/pdserve/public-tls/tls.key
{{- else }}
- --tls_cert=/etc/pdserve/tls/tls.crt
- --tls_key=/etc/pdserve/tls/tls.key
{{- end }}
{{- if ne .component "router" }}
- --tls_ca=/etc/pdserve/tls/ca.crt
{{- end }}
{{- if ne .component "tierd" }}
- --client_tls_ca=/etc/pdserve/tls/ca.crt
- --client_tls_cert=/etc/pdserve/tls/tls.crt
- --client_tls_key=/etc/pdserve/tls/tls.key
{{- end }}
- --cluster_token_file=/etc/pdserve/cluster-token/token
{{- if eq .component "router" }}
- --api_keys_file=/etc/pdserve/api-keys/api-keys
{{- end }}
{{- end }}
{{- end -}}

{{- define "pdserve.securityMounts" -}}
{{- if .root.Values.security.enabled }}
- name: tls
  mountPath: /etc/pdserve/tls
  readOnly: true
- name: cluster-token
  mountPath: /etc/pdserve/cluster-token
  readOnly: true
{{- if eq .component "router" }}
{{- if .root.Values.security.publicTls.existingSecret }}
- name: public-tls
  mountPath: /etc/pdserve/public-tls
  readOnly: true
{{- end }}
- name: api-keys
  mountPath: /etc/pdserve/api-keys
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "pdserve.securityVolumes" -}}
{{- if .root.Values.security.enabled }}
{{- $sec := .root.Values.security }}
- name: tls
  secret:
    secretName: {{ $sec.tls.existingSecret }}
    defaultMode: 288  # 0440: the runtime uid reads it through fsGroup
    items:
      - {key: {{ $sec.tls.caKey | quote }}, path: ca.crt}
      - {key: {{ $sec.tls.certKey | quote }}, path: tls.crt}
      - {key: {{ $sec.tls.keyKey | quote }}, path: tls.key}
- name: cluster-token
  secret:
    secretName: {{ $sec.clusterToken.existingSecret }}
    defaultMode: 288
    items:
      - {key: {{ $sec.clusterToken.key | quote }}, path: token}
{{- if eq .component "router" }}
{{- if $sec.publicTls.existingSecret }}
- name: public-tls
  secret:
    secretName: {{ $sec.publicTls.existingSecret }}
    defaultMode: 288
    items:
      - {key: {{ $sec.publicTls.certKey | quote }}, path: tls.crt}
      - {key: {{ $sec.publicTls.keyKey | quote }}, path: tls.key}
{{- end }}
- name: api-keys
  secret:
    secretName: {{ $sec.apiKeys.existingSecret }}
    defaultMode: 288
    items:
      - {key: {{ $sec.apiKeys.key | quote }}, path: api-keys}
{{- end }}
{{- end }}
{{- end -}}
