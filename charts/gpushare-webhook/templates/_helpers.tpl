{{/* The name of the release's objects: the release name, when it holds the chart's. */}}
{{- define "gpushare.fullname" -}}
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

{{/* Labels on every object: the kustomize install's, and Helm's bookkeeping. */}}
{{- define "gpushare.labels" -}}
app.kubernetes.io/part-of: gpushare-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpushare.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* What every pod of the release runs as: non-root, no privilege, the default seccomp. */}}
{{- define "gpushare.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "gpushare.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities: {drop: [ALL]}
{{- end -}}

{{- define "gpushare.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The CEL match condition: the pods that name one of the policy's GPU-sharing resources, or set NVIDIA_VISIBLE_DEVICES. */}}
{{- define "gpushare.gpuPods" -}}
{{- $policy := .Values.policy -}}
{{- $names := list (default "aliyun.com/gpu-mem" $policy.resourceName) (default "aliyun.com/gpu-core.percentage" (dig "compute" "resourceName" "" $policy)) (default "aliyun.com/gpu-count" (dig "multiGpu" "resourceName" "" $policy)) -}}
{{- $limits := list -}}
{{- $requests := list -}}
{{- range $names -}}
{{- $limits = append $limits (printf "'%s' in c.resources.limits" .) -}}
{{- $requests = append $requests (printf "'%s' in c.resources.requests" .) -}}
{{- end -}}
{{- $asks := printf "(has(c.resources) &&\n    ((has(c.resources.limits) && (%s)) ||\n     (has(c.resources.requests) && (%s)))) ||\n  (has(c.env) && c.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES'))" (join " || " $limits) (join " || " $requests) -}}
object.spec.containers.exists(c,
  {{ $asks }}) ||
(has(object.spec.initContainers) && object.spec.initContainers.exists(c,
  {{ $asks }})) ||
(has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c,
  has(c.env) && c.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES')))
{{- end -}}

{{/* The pod of certs install, for its Job and its CronJob. */}}
{{- define "gpushare.certsPod" -}}
{{- $name := include "gpushare.fullname" . -}}
metadata:
  labels:
    app.kubernetes.io/name: gpushare-webhook-certs
spec:
  serviceAccountName: {{ $name }}-certs
  restartPolicy: OnFailure
  {{- include "gpushare.pullSecrets" . | nindent 2 }}
  securityContext:
    {{- include "gpushare.podSecurity" . | nindent 4 }}
  containers:
    - name: certs
      image: {{ include "gpushare.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: [gpushare-webhook, certs, install]
      args:
        - --service={{ $name }}
        - --namespace={{ .Release.Namespace }}
        - --secret={{ $name }}-tls
        - --ca-secret={{ $name }}-ca
        - --webhook-config={{ $name }}
        - --renew-before={{ .Values.certificates.renewBefore }}
      resources:
        requests: {cpu: 50m, memory: 64Mi}
        limits: {cpu: 500m, memory: 128Mi}
      securityContext:
        {{- include "gpushare.containerSecurity" . | nindent 8 }}
{{- end -}}
