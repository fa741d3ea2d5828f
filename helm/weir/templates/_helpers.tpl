{{/*
Names, labels and the pieces several templates share. Helpers that answer yes or no return
"true" or "", to be tested with `eq (include ...) "true"`.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "weir.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: fullnameOverride, else "<release>-weir" (just the
release name when it already contains the chart name). 63 characters at most (DNS labels). */}}
{{- define "weir.fullname" -}}
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

{{/* "weir-0.1.0", for the helm.sh/chart label. */}}
{{- define "weir.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "weir.labels" -}}
helm.sh/chart: {{ include "weir.chart" . }}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels that select the server pods (never change them: Deployment selectors are immutable). */}}
{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The pods' service account. */}}
{{- define "weir.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "weir.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "weir.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* "true" when the database is PostgreSQL (shared by replicas, migrated by the hook Job). */}}
{{- define "weir.isPostgres" -}}
{{- if eq .Values.database.type "postgresql" -}}true{{- end -}}
{{- end -}}

{{/* The largest number of server pods: maxReplicas with the autoscaler, else replicaCount. */}}
{{- define "weir.maxReplicas" -}}
{{- if .Values.autoscaling.enabled -}}
{{- int64 .Values.autoscaling.maxReplicas -}}
{{- else -}}
{{- int64 .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Name of the ConfigMap holding the WEIR_* settings. */}}
{{- define "weir.configMapName" -}}
{{- printf "%s-config" (include "weir.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the endpoint picker's objects (Deployment, Service, ConfigMap, account). */}}
{{- define "weir.eppName" -}}
{{- printf "%s-epp" (include "weir.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the endpoint picker's pods. */}}
{{- define "weir.eppSelectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}-epp
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Claim names: an existing claim, else the chart's. */}}
{{- define "weir.dataClaimName" -}}
{{- default (printf "%s-data" (include "weir.fullname" .)) .Values.persistence.data.existingClaim -}}
{{- end -}}

{{- define "weir.cacheClaimName" -}}
{{- default (printf "%s-cache" (include "weir.fullname" .)) .Values.persistence.cache.existingClaim -}}
{{- end -}}

{{/* "true" when the data dir is mounted from a claim (SQLite only). */}}
{{- define "weir.dataOnClaim" -}}
{{- if and .Values.persistence.data.enabled (not (include "weir.isPostgres" .)) -}}true{{- end -}}
{{- end -}}

{{/* storageClassName line of a claim; the argument is a persistence.* block. "-" means "". */}}
{{- define "weir.storageClass" -}}
{{- if .storageClass -}}
{{- if eq "-" .storageClass -}}
storageClassName: ""
{{- else -}}
storageClassName: {{ .storageClass | quote }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Pod termination grace: the explicit value (checked), else preStop + ceil(grace) + 15. After
SIGTERM Weir lets requests run for the grace period, then waits up to 5 s for them to settle,
then stops the engine and writes the last usage records; the preStop sleep counts too. */}}
{{- define "weir.terminationGracePeriodSeconds" -}}
{{- $grace := int64 (ceil (.Values.config.shutdownGraceS | default 30)) -}}
{{- $needed := add (int64 .Values.shutdown.preStopSleepSeconds) $grace 5 -}}
{{- $explicit := .Values.shutdown.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $explicit -}}
{{- add $needed 10 -}}
{{- else if lt (int64 $explicit) $needed -}}
{{- fail (printf "shutdown.terminationGracePeriodSeconds must be at least preStopSleepSeconds + config.shutdownGraceS + 5 = %d, got %d (in-flight streams and the last usage records would be lost to SIGKILL)" $needed (int64 $explicit)) -}}
{{- else -}}
{{- int64 $explicit -}}
{{- end -}}
{{- end -}}

{{/* Refuse values that cannot work, with a message naming the value. */}}
{{- define "weir.validate" -}}
{{- if not (has .Values.database.type (list "sqlite" "postgresql")) -}}
{{- fail (printf "database.type must be sqlite or postgresql, got %q" .Values.database.type) -}}
{{- end -}}
{{- if include "weir.isPostgres" . -}}
{{- if not .Values.secrets.existingSecret -}}
{{- fail (printf "database.type postgresql needs secrets.existingSecret: a Secret holding %s (the chart never renders secret values)" .Values.secrets.keys.databaseUrl) -}}
{{- end -}}
{{- else -}}
{{- if gt (int64 .Values.replicaCount) 1 -}}
{{- fail "replicaCount > 1 needs database.type postgresql: SQLite is one file on a ReadWriteOnce volume and keeps token budgets in one process" -}}
{{- end -}}
{{- if .Values.autoscaling.enabled -}}
{{- fail "autoscaling needs database.type postgresql: replicas share token budgets through it" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (lt (int64 .Values.autoscaling.maxReplicas) (int64 .Values.autoscaling.minReplicas)) -}}
{{- fail "autoscaling.maxReplicas must be >= autoscaling.minReplicas" -}}
{{- end -}}
{{- if and (gt (int64 (include "weir.maxReplicas" .)) 1) .Values.persistence.cache.enabled (not .Values.persistence.cache.existingClaim) (not (has "ReadWriteMany" .Values.persistence.cache.accessModes)) -}}
{{- fail "several replicas (replicaCount or autoscaling.maxReplicas > 1) with persistence.cache need accessModes [ReadWriteMany], an existingClaim, or persistence.cache.enabled false (each pod prepares its own copy)" -}}
{{- end -}}
{{- $metricsPort := int64 (.Values.config.metricsPort | default 0) -}}
{{- if and $metricsPort (eq $metricsPort (int64 .Values.config.port)) -}}
{{- fail "config.metricsPort must differ from config.port (0: no metrics port)" -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not $metricsPort) -}}
{{- fail "metrics.serviceMonitor needs config.metricsPort > 0: /metrics on the API port needs the admin token" -}}
{{- end -}}
{{- if and (include "weir.kvStoreUrl" .) (not .Values.kvStore.existingSecret) -}}
{{- fail (printf "kvStore needs kvStore.existingSecret: a Secret holding %s, the MAC key of the store's values (the chart never renders secret values)" .Values.kvStore.keys.secret) -}}
{{- end -}}
{{- if and .Values.inferenceGateway.enabled (not $metricsPort) -}}
{{- fail "inferenceGateway needs config.metricsPort > 0: the endpoint picker scrapes Weir's metrics there" -}}
{{- end -}}
{{- if and .Values.shutdown.nativeSleep (semverCompare "<1.30-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "shutdown.nativeSleep needs Kubernetes 1.30+ (the preStop sleep action), this cluster is %s: set it false" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and .Values.gpu.enabled (lt (int64 .Values.gpu.count) 1) -}}
{{- fail "gpu.count must be >= 1 when gpu.enabled" -}}
{{- end -}}
{{- end -}}

{{/* The config block as WEIR_* variables, the ConfigMap's data; null and "" are left out so
Weir's defaults apply.
Helm reads numbers in values files as floats, and 8388608 would print as 8.388608e+06: whole
numbers are printed as integers. */}}
{{- define "weir.configEnv" -}}
{{- $device := .Values.config.device -}}
{{- if and (not $device) .Values.gpu.enabled -}}
{{- $device = "cuda" -}}
{{- end -}}
{{- $pairs := list -}}
{{- $pairs = append $pairs (list "WEIR_METRICS_PORT" .Values.config.metricsPort) -}}
{{- $pairs = append $pairs (list "WEIR_FORWARDED_ALLOW_IPS" .Values.config.forwardedAllowIps) -}}
{{- $pairs = append $pairs (list "WEIR_DATA_DIR" .Values.config.dataDir) -}}
{{- $pairs = append $pairs (list "WEIR_CACHE_DIR" .Values.config.cacheDir) -}}
{{- $pairs = append $pairs (list "WEIR_AUTH" .Values.config.auth) -}}
{{- $pairs = append $pairs (list "WEIR_AUTH_CACHE_TTL_S" .Values.config.authCacheTtlS) -}}
{{- $pairs = append $pairs (list "WEIR_RESPONSE_STORAGE_BYTES" .Values.config.responseStorageBytes) -}}
{{- $pairs = append $pairs (list "WEIR_RESPONSE_RETENTION_S" .Values.config.responseRetentionS) -}}
{{- $pairs = append $pairs (list "WEIR_RESPONSE_SWEEP_INTERVAL_S" .Values.config.responseSweepIntervalS) -}}
{{- $pairs = append $pairs (list "WEIR_RESPONSE_STORE_TIMEOUT_S" .Values.config.responseStoreTimeoutS) -}}
{{- $pairs = append $pairs (list "WEIR_OTEL_EXPORTER" .Values.config.otelExporter) -}}
{{- $pairs = append $pairs (list "WEIR_OTEL_ENDPOINT" .Values.config.otelEndpoint) -}}
{{- $pairs = append $pairs (list "WEIR_OTEL_SERVICE_NAME" .Values.config.otelServiceName) -}}
{{- $pairs = append $pairs (list "WEIR_SHUTDOWN_GRACE_S" .Values.config.shutdownGraceS) -}}
{{- $pairs = append $pairs (list "WEIR_MAX_REQUEST_BODY_BYTES" .Values.config.maxRequestBodyBytes) -}}
{{- $pairs = append $pairs (list "WEIR_LOG_LEVEL" .Values.config.logLevel) -}}
{{- $pairs = append $pairs (list "WEIR_GC_FREEZE" .Values.config.gcFreeze) -}}
{{- $pairs = append $pairs (list "WEIR_GIL_SWITCH_INTERVAL_MS" .Values.config.gilSwitchIntervalMs) -}}
{{- $pairs = append $pairs (list "WEIR_MODEL" .Values.config.model) -}}
{{- $pairs = append $pairs (list "WEIR_SERVED_MODEL_NAME" .Values.config.servedModelName) -}}
{{- $pairs = append $pairs (list "WEIR_MODEL_VERSION" .Values.config.modelVersion) -}}
{{- $pairs = append $pairs (list "WEIR_DEVICE" $device) -}}
{{- $pairs = append $pairs (list "WEIR_DTYPE" .Values.config.dtype) -}}
{{- $pairs = append $pairs (list "WEIR_KV_CACHE_TOKENS" .Values.config.kvCacheTokens) -}}
{{- $pairs = append $pairs (list "WEIR_HOST_KV_CACHE_TOKENS" .Values.config.hostKvCacheTokens) -}}
{{- $pairs = append $pairs (list "WEIR_KV_STORE_URL" .Values.config.kvStoreUrl) -}}
{{- $pairs = append $pairs (list "WEIR_KV_STORE_NAMESPACE" .Values.config.kvStoreNamespace) -}}
{{- $pairs = append $pairs (list "WEIR_KV_STORE_TTL_S" .Values.config.kvStoreTtlS) -}}
{{- $pairs = append $pairs (list "WEIR_KV_STORE_MAX_MIB" .Values.config.kvStoreMaxMib) -}}
{{- $pairs = append $pairs (list "WEIR_KV_STORE_TIMEOUT_MS" .Values.config.kvStoreTimeoutMs) -}}
{{- $pairs = append $pairs (list "WEIR_MEMORY_BUDGET_MIB" .Values.config.memoryBudgetMib) -}}
{{- $pairs = append $pairs (list "WEIR_ADAPTER_DIR" .Values.config.adapterDir) -}}
{{- $pairs = append $pairs (list "WEIR_LORA_SLOTS" .Values.config.loraSlots) -}}
{{- $pairs = append $pairs (list "WEIR_LORA_MAX_RANK" .Values.config.loraMaxRank) -}}
{{- $pairs = append $pairs (list "WEIR_MAX_MODEL_LEN" .Values.config.maxModelLen) -}}
{{- $pairs = append $pairs (list "WEIR_SPECULATIVE" .Values.config.speculative) -}}
{{- $pairs = append $pairs (list "WEIR_NUM_SPECULATIVE_TOKENS" .Values.config.numSpeculativeTokens) -}}
{{- $pairs = append $pairs (list "WEIR_ATTENTION_BACKEND" .Values.config.attentionBackend) -}}
{{- $pairs = append $pairs (list "WEIR_CUDA_GRAPHS" .Values.config.cudaGraphs) -}}
{{- $pairs = append $pairs (list "WEIR_CPU_ROW_WEIGHTS" .Values.config.cpuRowWeights) -}}
{{- $pairs = append $pairs (list "WEIR_CPU_RESERVED_CORES" .Values.config.cpuReservedCores) -}}
{{- $pairs = append $pairs (list "WEIR_CPU_WIDE_STEP_THREADS" .Values.config.cpuWideStepThreads) -}}
{{- $pairs = append $pairs (list "WEIR_CPU_WIDE_STEP_ROWS" .Values.config.cpuWideStepRows) -}}
{{- $pairs = append $pairs (list "WEIR_CPU_KERNEL_POOL" .Values.config.cpuKernelPool) -}}
{{- $pairs = append $pairs (list "WEIR_CPU_DECODE_LAYERS" .Values.config.cpuDecodeLayers) -}}
{{- $pairs = append $pairs (list "WEIR_MAX_NUM_SEQS" .Values.config.maxNumSeqs) -}}
{{- $pairs = append $pairs (list "WEIR_MAX_NUM_BATCHED_TOKENS" .Values.config.maxNumBatchedTokens) -}}
{{- $pairs = append $pairs (list "WEIR_TARGET_STEP_MS" .Values.config.targetStepMs) -}}
{{- $pairs = append $pairs (list "WEIR_ADMISSION_HOLD_MS" .Values.config.admissionHoldMs) -}}
{{- $pairs = append $pairs (list "WEIR_QUEUE_POLICY" .Values.config.queuePolicy) -}}
{{- $pairs = append $pairs (list "WEIR_ADMISSION" .Values.config.admission) -}}
{{- $pairs = append $pairs (list "WEIR_MAX_QUEUE_TIME_S" .Values.config.maxQueueTimeS) -}}
{{- $pairs = append $pairs (list "WEIR_MAX_QUEUED_TOKENS" .Values.config.maxQueuedTokens) -}}
{{- $pairs = append $pairs (list "WEIR_CLASS_REFUSE_FACTOR" .Values.config.classRefuseFactor) -}}
{{- $pairs = append $pairs (list "WEIR_LEASE_TOKENS" .Values.config.leaseTokens) -}}
{{- $pairs = append $pairs (list "WEIR_LEASE_TTL_S" .Values.config.leaseTtlS) -}}
{{- $pairs = append $pairs (list "WEIR_DEFAULT_MAX_TOKENS_RESERVATION" .Values.config.defaultMaxTokensReservation) -}}
{{- $pairs = append $pairs (list "WEIR_PREFIX_CACHING" .Values.config.prefixCaching) -}}
{{- $pairs = append $pairs (list "WEIR_TENANT_CACHE_SHARE" .Values.config.tenantCacheShare) -}}
{{- $pairs = append $pairs (list "WEIR_MAX_CHAT_MESSAGES" .Values.config.maxChatMessages) -}}
{{- $pairs = append $pairs (list "WEIR_PROMPT_CHARS_PER_TOKEN" .Values.config.promptCharsPerToken) -}}
{{- $pairs = append $pairs (list "WEIR_TOKENIZER_WORKERS" .Values.config.tokenizerWorkers) -}}
{{- $pairs = append $pairs (list "WEIR_TOKENIZER_TENANT_SHARE" .Values.config.tokenizerTenantShare) -}}
{{- $pairs = append $pairs (list "WEIR_TOKENIZER_INLINE_BYTES" .Values.config.tokenizerInlineBytes) -}}
{{- $pairs = append $pairs (list "WEIR_GRAMMAR_COMPILE_TIMEOUT_S" .Values.config.grammarCompileTimeoutS) -}}
{{- $pairs = append $pairs (list "WEIR_GRAMMAR_COMPILE_WORKERS" .Values.config.grammarCompileWorkers) -}}
{{- $pairs = append $pairs (list "WEIR_GRAMMAR_MASK_WORKERS" .Values.config.grammarMaskWorkers) -}}
{{- $pairs = append $pairs (list "WEIR_GRAMMAR_MASK_EXTRA_WORKERS" .Values.config.grammarMaskExtraWorkers) -}}
{{- $pairs = append $pairs (list "WEIR_GRAMMAR_MASK_TIMEOUT_S" .Values.config.grammarMaskTimeoutS) -}}
{{- $env := dict -}}
{{- range $pairs -}}
{{- $value := index . 1 -}}
{{- if not (or (kindIs "invalid" $value) (eq (toString $value) "")) -}}
{{- if kindIs "float64" $value -}}
{{- if eq $value (floor $value) -}}
{{- $value = int64 $value -}}
{{- end -}}
{{- end -}}
{{- $_ := set $env (index . 0) (toString $value) -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.config.kvStoreUrl) .Values.kvStore.valkey.enabled -}}
{{- /* The chart's own Valkey (kvStore.valkey) when config sets no external store. */ -}}
{{- $_ := set $env "WEIR_KV_STORE_URL" (include "weir.kvStoreUrl" .) -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}

{{/* WEIR_ADMIN_TOKEN, WEIR_KEY_PEPPER and WEIR_DATABASE_URL from secrets.existingSecret, by
reference; the first two as optional keys, the database URL required with PostgreSQL. */}}
{{/* Labels that select the chart's Valkey pod (not the server's: another name). */}}
{{- define "weir.kvStoreSelectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}-kv-store
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The KV store's URL: config.kvStoreUrl, else the chart's Valkey when enabled, else empty (off). */}}
{{- define "weir.kvStoreUrl" -}}
{{- if .Values.config.kvStoreUrl -}}
{{- .Values.config.kvStoreUrl -}}
{{- else if .Values.kvStore.valkey.enabled -}}
{{- printf "redis://%s-kv-store:6379/0" (include "weir.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* WEIR_KV_STORE_SECRET (required) and WEIR_KV_STORE_PASSWORD (optional) from
kvStore.existingSecret, by reference. */}}
{{- define "weir.kvStoreSecretEnv" -}}
{{- with .Values.kvStore.existingSecret }}
- name: WEIR_KV_STORE_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.kvStore.keys.secret }}
- name: WEIR_KV_STORE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.kvStore.keys.password }}
      optional: true
{{- end }}
{{- end -}}

{{- define "weir.secretEnv" -}}
{{- with .Values.secrets.existingSecret }}
- name: WEIR_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.secrets.keys.adminToken }}
      optional: true
- name: WEIR_KEY_PEPPER
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.secrets.keys.keyPepper }}
      optional: true
{{- if include "weir.isPostgres" $ }}
- name: WEIR_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.secrets.keys.databaseUrl }}
{{- end }}
{{- end }}
{{- end -}}
