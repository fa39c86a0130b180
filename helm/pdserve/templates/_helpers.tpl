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
{{- if .Values.redis.auth.enabled -}}
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
    items:
      - key: {{ include "pdserve.redisSecretKey" . }}
        path: {{ include "pdserve.redisSecretKey" . }}
{{- end }}
{{- end -}}

{{/* The model volume and its mount (model.source: hostPath | pvc | image). */}}
{{- define "pdserve.modelVolume" -}}
{{- if eq .Values.model.source "hostPath" -}}
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
{{- if .Values.model.tokenizer -}}
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

{{/* gRPC probes on grpc.health.v1 (Kubernetes >= 1.24). */}}
{{- define "pdserve.grpcProbes" -}}
readinessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- if .startupFailureThreshold }}
startupProbe:
  grpc:
    port: {{ .port }}
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

{{/*
Init container opening the node's hostPath directories to the runtime uid: hostPath volumes
ignore fsGroup, and DirectoryOrCreate makes them root-owned 0755. The shared-memory directory
becomes 1777 like /dev/shm (UCX puts its own segments there too); the NVMe directory is chowned.
(dict "root" $ "nvme" true|false)
*/}}
{{- define "pdserve.hostDirsInit" -}}
- name: host-dirs
  image: {{ include "pdserve.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command:
    - /bin/sh
    - -c
    - chmod 1777 /host/shm{{ if .nvme }} && chown {{ .root.Values.podSecurityContext.runAsUser | default 65532 | int64 }}:{{ .root.Values.podSecurityContext.runAsGroup | default 65532 | int64 }} /host/nvme && chmod 0750 /host/nvme{{ end }}
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
      add: [CHOWN, FOWNER]
  volumeMounts:
    - name: shm
      mountPath: /host/shm
    {{- if .nvme }}
    - name: nvme
      mountPath: /host/nvme
    {{- end }}
{{- end -}}
