{{/*
Release-wide name: fullnameOverride, else the release name. Kept short
enough that `<fullname>-executor-playbook` fits in 63 characters.
*/}}
{{- define "noetl.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- end -}}

{{- define "noetl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "noetl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "noetl.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* Labels of every object of the release. */}}
{{- define "noetl.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: noetl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: noetl
{{- end -}}

{{/*
The components: the three services, the api when services.api.enabled,
then every enabled executor kind, as a YAML list of {name, component,
group, key, kind}. `group`/`key` locate the component's values
(`.Values.<group>.<key>`).
*/}}
{{- define "noetl.components" -}}
{{- range list (list "router" "router") (list "scheduler" "scheduler") (list "loop-supervisor" "loopSupervisor") }}
- name: {{ index . 0 }}
  component: {{ index . 0 }}
  group: services
  key: {{ index . 1 }}
  kind: ""
{{- end }}
{{- with .Values.services.timer }}
{{- if .enabled }}
- name: timer
  component: timer
  group: services
  key: timer
  kind: ""
{{- end }}
{{- end }}
{{- with .Values.services.api }}
{{- if .enabled }}
- name: api
  component: api
  group: services
  key: api
  kind: ""
{{- end }}
{{- end }}
{{- range $kind, $ex := .Values.executors }}
{{- if and $ex (or (not (hasKey $ex "enabled")) $ex.enabled) }}
- name: executor-{{ $kind }}
  component: executor
  group: executors
  key: {{ $kind }}
  kind: {{ $kind }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "c" $component). */}}
{{- define "noetl.selectorLabels" -}}
app.kubernetes.io/name: noetl
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .c.component }}
{{- if .c.kind }}
noetl.io/kind: {{ .c.kind }}
{{- end }}
{{- end -}}

{{/* All labels of one component's objects: (dict "root" $ "c" $component). */}}
{{- define "noetl.labels" -}}
{{ include "noetl.commonLabels" .root }}
app.kubernetes.io/component: {{ .c.component }}
{{- if .c.kind }}
noetl.io/kind: {{ .c.kind }}
{{- end }}
{{- end -}}

{{/* The values of one component: (dict "root" $ "c" $component). */}}
{{- define "noetl.cfg" -}}
{{- toYaml (index .root.Values .c.group .c.key) -}}
{{- end -}}

{{/*
Effective autoscaling of one executor kind (the global `autoscaling`
overlaid with the kind's own), as YAML; `enabled: false` for services.
*/}}
{{- define "noetl.autoscaling" -}}
{{- $cfg := index .root.Values .c.group .c.key -}}
{{- if and (eq .c.group "executors") $cfg.autoscaling -}}
{{- toYaml (mergeOverwrite (deepCopy .root.Values.autoscaling) (deepCopy $cfg.autoscaling)) -}}
{{- else -}}
enabled: false
{{- end -}}
{{- end -}}

{{/* One scheduling key of a component: its own value if it has the key, else the global one. */}}
{{- define "noetl.pick" -}}
{{- $cfg := index .root.Values .c.group .c.key -}}
{{- if hasKey $cfg .key -}}
{{- toYaml (dict "v" (index $cfg .key)) -}}
{{- else -}}
{{- toYaml (dict "v" (index .root.Values .key)) -}}
{{- end -}}
{{- end -}}

{{/* Pod scheduling: nodeSelector, affinity, tolerations, topologySpreadConstraints. */}}
{{- define "noetl.scheduling" -}}
{{- $ctx := . -}}
{{- with (include "noetl.pick" (merge (dict "key" "nodeSelector") $ctx) | fromYaml).v }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (include "noetl.pick" (merge (dict "key" "affinity") $ctx) | fromYaml).v }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (include "noetl.pick" (merge (dict "key" "tolerations") $ctx) | fromYaml).v }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (include "noetl.pick" (merge (dict "key" "topologySpreadConstraints") $ctx) | fromYaml).v }}
{{- $selector := include "noetl.selectorLabels" $ctx | fromYaml }}
{{- $all := list }}
{{- range . }}
{{- $tsc := deepCopy . }}
{{- if not (hasKey $tsc "labelSelector") }}
{{- $_ := set $tsc "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $all = append $all $tsc }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $all | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Environment of every container: (dict "root" $ "c" $component). */}}
{{- define "noetl.env" -}}
{{- $v := .root.Values -}}
{{- $cfg := index $v .c.group .c.key -}}
- name: NOETL_NATS_URL
  value: {{ $v.nats.url | quote }}
- name: NOETL_PREFIX
  value: {{ $v.prefix | quote }}
- name: NOETL_REPLICAS
  value: {{ $v.nats.replicas | quote }}
- name: NOETL_HOME
  value: /var/lib/noetl
{{- with $v.nats.credentials.existingSecret }}
- name: NOETL_NATS_CREDS
  value: /etc/noetl/nats-credentials/nats.creds
{{- end }}
{{- with $v.nats.nkey.existingSecret }}
- name: NOETL_NATS_NKEY
  value: /etc/noetl/nats-nkey/nkey.seed
{{- end }}
{{- with $v.nats.userPassword }}
{{- if .existingSecret }}
- name: NOETL_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .userKey }}
- name: NOETL_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .passwordKey }}
{{- end }}
{{- end }}
{{- with $v.nats.token }}
{{- if .existingSecret }}
- name: NOETL_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- with $v.nats.tls }}
{{- if .existingSecret }}
{{- if .caKey }}
- name: NOETL_NATS_CA
  value: /etc/noetl/nats-tls/ca.crt
{{- end }}
{{- if and .certKey .keyKey }}
- name: NOETL_NATS_CERT
  value: /etc/noetl/nats-tls/tls.crt
- name: NOETL_NATS_KEY
  value: /etc/noetl/nats-tls/tls.key
{{- end }}
{{- end }}
{{- end }}
{{- with $v.tracing }}
{{- if .otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | default "http/protobuf" | quote }}
{{- end }}
{{- end }}
{{- with $v.objectStore }}
{{- if .url }}
- name: NOETL_OBJECT_STORE
  value: {{ .url | quote }}
{{- end }}
{{- if .endpoint }}
- name: NOETL_S3_ENDPOINT
  value: {{ .endpoint | quote }}
{{- end }}
{{- if .region }}
- name: AWS_REGION
  value: {{ .region | quote }}
{{- end }}
{{- if .existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .secretAccessKeyKey }}
{{- end }}
{{- if .keychainCredential }}
- name: NOETL_S3_CREDENTIAL
  value: {{ .keychainCredential | quote }}
{{- end }}
{{- end }}
{{- if $v.secretKey.existingSecret }}
- name: NOETL_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $v.secretKey.existingSecret }}
      key: {{ $v.secretKey.key }}
{{- end }}
{{- if eq .c.component "api" }}
{{- with include "noetl.api.tokenSecret" .root }}
- name: NOETL_API_BOOTSTRAP_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $cfg.auth.key }}
{{- end }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- if and (eq .c.kind "python") (not (hasKey ($cfg.env | default dict) "NOETL_PYTHON_WARM")) }}
- name: NOETL_PYTHON_WARM
  value: {{ $cfg.concurrency | quote }}
{{- end }}
{{- range $name, $value := $cfg.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* Secret files mounted into every container. */}}
{{- define "noetl.secretMounts" -}}
{{- $v := .Values -}}
{{- if $v.nats.credentials.existingSecret }}
- name: nats-credentials
  mountPath: /etc/noetl/nats-credentials
  readOnly: true
{{- end }}
{{- if $v.nats.nkey.existingSecret }}
- name: nats-nkey
  mountPath: /etc/noetl/nats-nkey
  readOnly: true
{{- end }}
{{- if $v.nats.tls.existingSecret }}
- name: nats-tls
  mountPath: /etc/noetl/nats-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "noetl.secretVolumes" -}}
{{- $v := .Values -}}
{{- with $v.nats.credentials }}
{{- if .existingSecret }}
- name: nats-credentials
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .key }}
        path: nats.creds
{{- end }}
{{- end }}
{{- with $v.nats.nkey }}
{{- if .existingSecret }}
- name: nats-nkey
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .key }}
        path: nkey.seed
{{- end }}
{{- end }}
{{- with $v.nats.tls }}
{{- if .existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      {{- if .caKey }}
      - key: {{ .caKey }}
        path: ca.crt
      {{- end }}
      {{- if and .certKey .keyKey }}
      - key: {{ .certKey }}
        path: tls.crt
      - key: {{ .keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The port a component serves on (`--http-addr`, probes, metrics): the api's
own `services.api.port`, else `httpPort`. (dict "root" $ "c" $component).
*/}}
{{- define "noetl.port" -}}
{{- if eq .c.component "api" -}}
{{- .root.Values.services.api.port -}}
{{- else -}}
{{- .root.Values.httpPort -}}
{{- end -}}
{{- end -}}

{{/* "true" when the component serves TLS itself (the api with tls.existingSecret). */}}
{{- define "noetl.tls" -}}
{{- if and (eq .c.component "api") .root.Values.services.api.tls.existingSecret -}}
true
{{- end -}}
{{- end -}}

{{/*
The Secret holding the api's bootstrap token: auth.existingSecret, else
the chart's `<fullname>-api-token`; empty with auth.insecureNoAuth.
*/}}
{{- define "noetl.api.tokenSecret" -}}
{{- with .Values.services.api.auth -}}
{{- if .existingSecret -}}
{{- .existingSecret -}}
{{- else if not .insecureNoAuth -}}
{{- include "noetl.fullname" $ }}-api-token
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Arguments of `noetl serve api` after `serve api`. */}}
{{- define "noetl.api.args" -}}
{{- $api := .Values.services.api -}}
- --http-addr
- {{ printf "0.0.0.0:%v" $api.port | quote }}
- --log-format
- {{ .Values.logFormat | quote }}
{{- if $api.auth.insecureNoAuth }}
- --insecure-no-auth
{{- end }}
{{- if $api.tls.existingSecret }}
- --tls-cert
- /etc/noetl/api-tls/tls.crt
- --tls-key
- /etc/noetl/api-tls/tls.key
{{- end }}
{{- end -}}

{{/*
Refuse values that cannot work, naming what to set. Included by
templates/validate.yaml, so `helm template` / `install` fail at once.
*/}}
{{- define "noetl.validate" -}}
{{- $root := . -}}
{{- $v := .Values -}}
{{- $multi := list -}}
{{- range $c := include "noetl.components" . | fromYamlArray }}
{{- $cfg := index $v $c.group $c.key }}
{{- $as := include "noetl.autoscaling" (dict "root" $root "c" $c) | fromYaml }}
{{- $path := printf "%s.%s" $c.group $c.key }}
{{- if $as.enabled }}
{{- $multi = append $multi (printf "%s.autoscaling.enabled=true" $path) }}
{{- if gt (int $as.minReplicas) (int $as.maxReplicas) }}
{{- fail (printf "noetl: %s.autoscaling: minReplicas (%v) is above maxReplicas (%v)" $path $as.minReplicas $as.maxReplicas) }}
{{- end }}
{{- if eq $as.type "hpa" }}
{{- if lt (int $as.minReplicas) 1 }}
{{- fail (printf "noetl: %s.autoscaling: an HPA needs minReplicas >= 1 (scale to zero needs type: keda)" $path) }}
{{- end }}
{{- if not (and $cfg.resources $cfg.resources.requests $cfg.resources.requests.cpu) }}
{{- fail (printf "noetl: %s.autoscaling (type hpa) scales on CPU utilisation: set %s.resources.requests.cpu" $path $path) }}
{{- end }}
{{- end }}
{{- else if gt (int $cfg.replicas) 1 }}
{{- $multi = append $multi (printf "%s.replicas=%v" $path $cfg.replicas) }}
{{- end }}
{{- end }}
{{- if $multi }}
{{- $missing := list }}
{{- if not (hasPrefix "s3://" $v.objectStore.url) }}
{{- $missing = append $missing (printf "objectStore.url=s3://BUCKET (now %q; plus objectStore.endpoint for MinIO and objectStore.existingSecret for its keys): every replica must read the results the others store by reference" $v.objectStore.url) }}
{{- end }}
{{- if not $v.secretKey.existingSecret }}
{{- $missing = append $missing "secretKey.existingSecret=<Secret with key secret-key, e.g. kubectl create secret generic noetl-secret-key --from-literal=secret-key=$(openssl rand -hex 32)>: every replica must decrypt with the same key" }}
{{- end }}
{{- if $missing }}
{{- fail (printf "noetl: more than one replica (%s) needs shared state. Set %s. Or run one replica of every component (replicas: 1, no autoscaling)." (join ", " $multi) (join "; and " $missing)) }}
{{- end }}
{{- end }}
{{- $auth := list }}
{{- range $k := list "credentials" "nkey" "userPassword" "token" }}
{{- if (index $v.nats $k).existingSecret }}
{{- $auth = append $auth (printf "nats.%s.existingSecret" $k) }}
{{- end }}
{{- end }}
{{- if gt (len $auth) 1 }}
{{- fail (printf "noetl: NATS authentication takes one method; %s are all set: keep one" (join ", " $auth)) }}
{{- end }}
{{- with $v.services.api }}
{{- if .enabled }}
{{- if and .auth.insecureNoAuth .auth.existingSecret }}
{{- fail (printf "noetl: services.api.auth: insecureNoAuth (--insecure-no-auth) and existingSecret (%s, the bootstrap token) are both set: keep one" .auth.existingSecret) }}
{{- end }}
{{- if and .ingress.enabled (empty .ingress.hosts) }}
{{- fail "noetl: services.api.ingress.enabled needs at least one entry in services.api.ingress.hosts (host: \"\" for any host)" }}
{{- end }}
{{- end }}
{{- end }}
{{- with $v.nats.tls }}
{{- if .existingSecret }}
{{- if ne (empty .certKey) (empty .keyKey) }}
{{- fail "noetl: nats.tls: a client certificate needs both certKey and keyKey (or neither)" }}
{{- end }}
{{- if and (empty .caKey) (empty .certKey) }}
{{- fail "noetl: nats.tls.existingSecret is set but neither nats.tls.caKey nor nats.tls.certKey/keyKey names a key in it" }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
