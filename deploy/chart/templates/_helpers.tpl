{{/* Labels every object carries. */}}
{{- define "gpuslice.labels" -}}
app.kubernetes.io/part-of: gpuslice
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* An image reference: images.registry (a mirror of all three) if set, else the image's own registry, then
the repository, then the tag (appVersion when empty). */}}
{{- define "gpuslice.image" -}}
{{- $image := index .root.Values.images .name -}}
{{- $tag := $image.tag | default .root.Chart.AppVersion -}}
{{- $registry := .root.Values.images.registry | default $image.registry | trimSuffix "/" -}}
{{- if $registry -}}
{{ printf "%s/%s:%s" $registry $image.repository $tag }}
{{- else -}}
{{ printf "%s:%s" $image.repository $tag }}
{{- end -}}
{{- end -}}

{{/* The extender Service's DNS name: what the serving certificate carries and clients verify. */}}
{{- define "gpuslice.serviceHost" -}}
gpuslice-extender.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* The webhook's Service (every ready extender replica), a name the serving certificate holds too. */}}
{{- define "gpuslice.webhookHost" -}}
gpuslice-webhook.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* Product names of the catalog, comma-separated: v100-25,v100-50,v100-100 (the admission policies' params). */}}
{{- define "gpuslice.productNames" -}}
{{- $names := list -}}{{- range .Values.catalog.products }}{{ $names = append $names .name }}{{ end -}}
{{ join "," $names }}
{{- end -}}

{{/* Product names of fractional products (less than a whole card), comma-separated. */}}
{{- define "gpuslice.fractionalNames" -}}
{{- $names := list -}}{{- range .Values.catalog.products }}{{ if lt (int .milli) 1000 }}{{ $names = append $names .name }}{{ end }}{{ end -}}
{{ join "," $names }}
{{- end -}}

{{/* The admission policies' parameters: the catalog ConfigMap. Missing (only while an uninstall removes
it before the policies), the policies do not apply: a missing catalog must never refuse every pod. */}}
{{- define "gpuslice.catalogParams" -}}
paramRef:
  name: gpuslice-catalog
  namespace: {{ .Release.Namespace }}
  parameterNotFoundAction: Allow
{{- end -}}

{{/* Namespaces exempt from the webhook and the admission policies: the release's (ns) and the listed ones (extra). */}}
{{- define "gpuslice.exempt" -}}
{{- $list := list .ns -}}
{{- range .extra }}{{ if not (has . $list) }}{{ $list = append $list . }}{{ end }}{{ end -}}
{{ toJson $list }}
{{- end -}}

{{/* The extender's identity in the API (its ServiceAccount): the one writer of allocation records. */}}
{{- define "gpuslice.extenderUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpuslice-extender
{{- end -}}

{{/* The extender's weight in the scheduler profile: set, or by mode (deploy/README.md). */}}
{{- define "gpuslice.extenderWeight" -}}
{{- if kindIs "invalid" .Values.scheduler.extenderWeight -}}
{{ if eq .Values.mode "cooperative" }}150{{ else }}20{{ end }}
{{- else -}}
{{ .Values.scheduler.extenderWeight }}
{{- end -}}
{{- end -}}

{{/* A pod securityContext for our non-root components. */}}
{{- define "gpuslice.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The pod of the certificate Jobs and CronJob: `gpuslice certs` in the extender's image. "init" (Helm's
pre-install and pre-upgrade hook: the Secrets before the pods that mount them) runs under the hook's own
service account and neither waits for the webhook nor restarts anything; the others set the webhook's
caBundle and restart the readers of a certificate that changed. */}}
{{- define "gpuslice.certsPod" -}}
{{- $root := .root -}}
{{- $init := eq .job "init" -}}
metadata:
  labels:
    {{- include "gpuslice.labels" $root | nindent 4 }}
    app.kubernetes.io/name: gpuslice-certs
spec:
  serviceAccountName: {{ ternary "gpuslice-certs-init" "gpuslice-certs" $init }}
  restartPolicy: OnFailure
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: certs
      image: {{ include "gpuslice.image" (dict "root" $root "name" "extender") }}
      imagePullPolicy: {{ $root.Values.images.extender.pullPolicy }}
      command:
        - gpuslice
        - certs
        - --namespace
        - {{ $root.Release.Namespace }}
        - --ca-days
        - {{ $root.Values.tls.bootstrap.caDays | quote }}
        - --leaf-days
        - {{ $root.Values.tls.bootstrap.leafDays | quote }}
        - --renew-within-days
        - {{ $root.Values.tls.bootstrap.renewWithinDays | quote }}
        - --san  # the webhook's Service: kube-apiserver checks this name
        - {{ include "gpuslice.webhookHost" $root }}
        {{- if $init }}
        - --secrets-only
        {{- else }}
        - --wait-webhook
        - "300"
        - --restart
        {{- end }}
      env:
        - name: HOME
          value: /tmp
      resources:
        requests: {cpu: 50m, memory: 64Mi}
        limits: {memory: 256Mi}
      securityContext:
        {{- include "gpuslice.restricted" $root | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tmp
      emptyDir:
        medium: Memory
        sizeLimit: 16Mi
{{- end -}}

{{/* A Helm hook that runs before install and upgrade, removed once it succeeded (kept when it failed, to
be read; the next run replaces it). */}}
{{- define "gpuslice.initHook" -}}
helm.sh/hook: pre-install,pre-upgrade
helm.sh/hook-weight: {{ .weight | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}
